"""A problem file nobody can solve: every notebook that needs a mixed-reward group stops with one line
naming the cause and the knobs (base.NoSignal), before any table is written; the runner prints that
line alone (no cell listing, no traceback) and promotes nothing."""
import importlib
import json
import subprocess
import sys

import pytest

from cancellation import profiles, resolve
from cancellation.figures import base


@pytest.fixture(scope="module")
def unsolvable(canonical_standins, tmp_path_factory):
    """The stand-in problems with every gold replaced by a number no stand-in response states."""
    rows = [json.loads(line) for line in (profiles.ROOT / "data" / "standins" / "plain.jsonl").read_text().splitlines()]
    f = tmp_path_factory.mktemp("unsolvable") / "unsolvable.jsonl"
    f.write_text("".join(json.dumps({**r, "answer": "\\frac{99991}{7}"}) + "\n" for r in rows))
    return f


@pytest.mark.slow
@pytest.mark.parametrize("nb", ["01", "02", "03", "04", "05", "06", "08"])
def test_no_reward_stops_with_one_line(nb, unsolvable):
    params = resolve.resolve_params(profiles.find_notebook(nb), "paper-smoke", {"problems_path": str(unsolvable)})
    mod = importlib.import_module(f"cancellation.figures.fig{nb}")
    P = mod.Params(**{k: v for k, v in params.items() if k not in profiles.INJECTED})
    with pytest.raises(base.NoSignal) as e:
        mod.compute(P)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{nb}: ")
    assert "(0 of " in msg and "problems_path" in msg and "n_prompts" in msg
    assert "math-verify (answer_mode " in msg     # the grader's own counts ride along, naming its mode


@pytest.mark.slow
def test_07_stops_with_one_line_when_no_run_had_a_mixed_batch(unsolvable):
    """07 on paper-smoke (TRL): every run samples only unrewarded groups, so no step carries a signal
    (TRL still steps on A = 0); the notebook ends with the one line, not a TypeError in a plot. Every
    strategy of the profile trains (each plan and buffer meets the unrewarded batches), on one seed and
    without the lr sweep's reruns of two of them: 6 TRL runs, not 14; the stop needs no run to mix."""
    p = subprocess.run([sys.executable, "-m", "cancellation.run", "07", "--profile", "paper-smoke",
                        "-p", "problems_path", str(unsolvable), "-p", "seeds", "[0]", "-p", "probe_lrs", "[]"],
                       capture_output=True, text=True, cwd=profiles.ROOT)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: 07_batching stopped: 07: the training runs: no group mixes"), last
    assert "(0 of " in last and "problems_path" in last


@pytest.mark.slow
def test_runner_prints_the_line_alone_and_promotes_nothing(unsolvable):
    p = subprocess.run([sys.executable, "-m", "cancellation.run", "02", "--profile", "paper-smoke",
                        "-p", "problems_path", str(unsolvable)], capture_output=True, text=True, cwd=profiles.ROOT)
    assert p.returncode == 1
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert err[-1].startswith("error: 02_coupling_heatmaps stopped: 02: the coupling batch: no group mixes")
    assert "Traceback" not in p.stderr and "cell" not in err[-1]
    assert not [x for x in p.stdout.splitlines() if "outputs in" in x]   # nothing promoted
