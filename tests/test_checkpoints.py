"""Long TRL runs resume (issue 49, item 5): `engine.train_trl(save_every=...)` checkpoints at iteration
boundaries and `resume=True` picks up at the last one. A run interrupted after k iterations and resumed
must give what the same run never interrupted gives: the final weights bit for bit and every record
(per-step loss, clip fraction, gradient norm; the mini-batch rows; the iteration rows with RB's buffer
counters; the evaluations; the monitor's shares). CPU, the tiny-s policy, float32, one thread."""
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from cancellation import engine, policy, sources  # noqa: E402

MODEL = "data/policies/tiny-s"
SOURCE = dict(kinds=("add2", "sub2"))
RUN = dict(iterations=3, n_prompts=4, G=4, n_minibatches=2, max_new_tokens=48, tau=0.25, max_rounds=3,
           eval_every=1)

pytestmark = [pytest.mark.skipif(not (Path(MODEL) / "config.json").exists(), reason="needs make policy"),
              pytest.mark.slow]


def _eval(model, tok):
    """A number that moves with every weight (the held-out evaluation's place in the run)."""
    return {"weights": float(sum(p.detach().double().sum() for p in model.parameters()))}


class Interrupt(Exception):
    pass


def _stop_after(step: int):
    from transformers import TrainerCallback

    class _Stop(TrainerCallback):   # after the checkpoint at `step` is complete: a kill between iterations
        def on_save(self, args, state, control, **kw):
            if state.global_step == step:
                raise Interrupt(step)
    return _Stop()


def _steps_taken():
    from transformers import TrainerCallback

    class _Count(TrainerCallback):
        n = 0

        def on_step_end(self, args, state, control, **kw):
            type(self).n += 1
    return _Count()


def _train(strategy, out, save_every=1, **kw):
    torch.manual_seed(0)
    model, tok = policy.load_policy(MODEL, dtype="float32")
    res = engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), strategy, output_dir=out, model=model,
                           tokenizer=tok, dtype="float32", eval_fn=_eval, progress=False, tensorboard=False,
                           save_every=save_every, **{**RUN, **kw})
    return res, model


def _frames(res):
    steps = res["steps"].drop(columns=["seconds"])
    its = res["iterations"].drop(columns=["t_sample"])
    return dict(steps=steps, minibatches=res["minibatches"], iterations=its, evals=res["evals"],
                monitor=res["monitor"])


@pytest.mark.parametrize("strategy", ["random", "QB+RB"])
def test_an_interrupted_run_resumes_to_the_same_weights_and_records(strategy):
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, tempfile.TemporaryDirectory() as c:
        whole, m_whole = _train(strategy, a)
        plain, m_plain = _train(strategy, c, save_every=0)   # saving checkpoints changes no number
        assert not list(Path(c).glob("checkpoint-*")) and len(list(Path(a).glob("checkpoint-*"))) == 2
        assert all(x.equals(_frames(plain)[k]) for k, x in _frames(whole).items())
        assert all(torch.equal(p, q) for p, q in zip(m_whole.parameters(), m_plain.parameters()))
        k = 1   # iterations done before the interruption
        with pytest.raises(Interrupt):
            _train(strategy, b, callbacks=[_stop_after(k * RUN["n_minibatches"])])
        assert engine.last_checkpoint(b).name == f"checkpoint-{k * RUN['n_minibatches']}"
        count = _steps_taken()
        resumed, m_resumed = _train(strategy, b, resume=True, callbacks=[count])
        total = RUN["iterations"] * RUN["n_minibatches"]
        assert len(whole["steps"]) == len(resumed["steps"]) == total > count.n >= 1   # it went on, not over
        for name, x in _frames(whole).items():
            y = _frames(resumed)[name]
            assert len(x) and x.reset_index(drop=True).equals(y.reset_index(drop=True)), (name, x, y)
        for (n1, p1), (n2, p2) in zip(m_whole.named_parameters(), m_resumed.named_parameters()):
            assert n1 == n2 and torch.equal(p1, p2), n1
        assert whole["evals"].iteration.tolist() == list(range(RUN["iterations"] + 1))
        start, _ = policy.load_policy(MODEL, dtype="float32")   # the runs trained: signal in every record
        assert not all(torch.equal(p, q) for p, q in zip(start.parameters(), m_whole.parameters()))
        assert whole["evals"].accuracy.nunique() == len(whole["evals"])
        assert set(whole["monitor"].sign) == {"pos", "neg"} and (whole["minibatches"].sign != 0).any()


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path):
    assert engine.last_checkpoint(tmp_path) is None
    (tmp_path / "checkpoint-4").mkdir()    # cut off while saving: no run state in it
    assert engine.last_checkpoint(tmp_path) is None
