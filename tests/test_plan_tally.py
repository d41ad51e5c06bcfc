"""The planner's workloads held against what a real paper-smoke run computes (issue 36, item 2).

Each notebook runs on `paper-smoke` under the Compute guard with a tally (`guard._tally`): every
position through the LM head (TRL's fused head included, as it projects them: on a CPU every position of
the rows) and through the model's body (every forward of a guarded model: analysis, steps, the sampler's
prefill, transformers' `generate` step by step, TRL's forwards). The plan's counts for the same Params
must be within 2x of the tally:

- body: every block's positions, less our sampler's decode steps (`decode_lean.LeanStep` runs the layers
  without the module call the guard hooks; the plan counts them as `sample`'s head positions, one per
  row and new token), within 2x both ways;
- head: the plan's is an upper bound (every response runs to max_new_tokens; the stand-in's stop
  earlier), so the tally is at most the plan, and within 2x of it where fixed-length work dominates
  (07: TRL's fused head over the prompts too). Where responses are short the head is over-planned by
  more than 2x; the ratio is printed.

Planned / tallied on 2026-11-26 (body, head): 01 1.02, 3.1; 02 1.11, 4.6; 03 1.02, 3.6; 04 1.14, 4.3;
05 1.34, 4.2; 06 1.86, 7.5; 07 1.24, 1.33; 08 1.34, 3.4. Every notebook runs here with a cache of its own
(about 1-2 min each on 2 shared cores). `make test` checks the three the issue names (02, 04, 07) to keep
the suite near 20 min, on test_paper_smoke.py's runs of them (each with a cache of its own and the tally:
`check_tally` there, not a second run of the notebook here); `TALLY_ALL=1 pytest -m slow
tests/test_plan_tally.py` runs all eight here.
"""
import json
import os

import pytest

from cancellation import execute, guard, manifest, plan, profiles, resolve

# notebook -> whether its planned head positions must be within 2x of the tally (else: an upper bound)
NOTEBOOKS = {f.key: f.key == "07" for f in manifest.FIGURES}


def plan_counts(ref: str, params: dict) -> dict:
    """The plan's positions through the head and (as the guard sees them) through the body."""
    nb = profiles.find_notebook(ref)
    p = plan.make(nb.stem, params)
    b = p.work.blocks
    return dict(head=sum(v["head"] for v in b.values()),
                body=sum(v["positions"] - (v["head"] if k == "sample" else 0) for k, v in b.items()),
                seconds=p.seconds)


def tally_run(ref: str, out_root, log, profile: str = "paper-smoke") -> dict:
    params = resolve.resolve_params(profiles.find_notebook(ref), profile, None, out_root)
    knobs = {k: params[k] for k in guard.KNOBS if k in params}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(guard.GUARD_ENV, json.dumps(dict(knobs, log=str(log))))
        mp.setenv("CANCELLATION_CACHE", str(out_root / "cache"))   # every position computed here
        out = execute.run_notebook(ref, profile, out_root=out_root, log_output=False)
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return params


def check_tally(ref: str, params: dict, log) -> None:
    """The plan's body and head positions for `params` against the guard's tally in `log` (a run with a
    cache of its own)."""
    t = json.loads(log.read_text())
    planned = plan_counts(ref, params)
    body, head = planned["body"] / t["body_positions"], planned["head"] / t["head_positions"]
    print(f"{ref}: body planned/tallied {body:.2f} ({planned['body']:,} / {t['body_positions']:,}), head "
          f"{head:.2f} ({planned['head']:,} / {t['head_positions']:,})")
    assert 0.5 <= body <= 2.0, (planned, t)
    assert head >= 1.0 if not NOTEBOOKS[ref] else 0.5 <= head <= 2.0, (planned, t)


# make test checks the three the issue names (02, 04, 07) on test_paper_smoke.py's runs of them (fresh caches,
# the guard's tally: the same run this file would make; check_tally there), not on a second run here
ON_PAPER_SMOKE = ("02", "04", "07")


@pytest.mark.slow
@pytest.mark.parametrize("ref", list(NOTEBOOKS))
def test_workload_within_2x_of_the_tally(ref, canonical_standins, tmp_path):
    if not os.environ.get("TALLY_ALL"):
        pytest.skip(f"{', '.join(ON_PAPER_SMOKE)}: test_paper_smoke.py's runs; the rest with TALLY_ALL=1 (1-2 min each)"
                    if ref in ON_PAPER_SMOKE else "the other five with TALLY_ALL=1 (1-2 min each)")
    log = tmp_path / "tally.json"
    check_tally(ref, tally_run(ref, tmp_path, log), log)


def test_07_plans_trl_blocks_on_paper_smoke():
    """07 on TRL plans TRL's blocks (not the small trainer's), one trl_run per strategy x seed and sweep run;
    the CPU's fused head scores every position of the rows, a GPU's (Triton) only the completions."""
    params = resolve.resolve_params(profiles.find_notebook("07"), "paper-smoke")
    p = plan.make("07_batching", params)
    b = p.work.blocks
    n_runs = b["trl_run"]["calls"]
    assert n_runs == len(params["strategies"]) * len(params["seeds"]) + \
        len(params["probe_lrs"]) * len(params["probe_strategies"]) * len(params["probe_seeds"])
    assert b["trl_step"]["head"] == b["trl_step"]["positions"]       # CPU: every position through the head
    gpu = plan.make("07_batching", dict(params, device="cuda"), kind="nvidia-h100-80gb-hbm3")
    g = gpu.work.blocks
    assert g["trl_step"]["head"] < g["trl_step"]["positions"]
    # the H100's file has no TRL measurement: the plan says which blocks stand in or are left out
    text = "\n".join(gpu.lines())
    assert "no measurement on nvidia-h100-80gb-hbm3" in text and "trl_generate as sample" in text
    assert "trl_optimizer_step" in text and "left out of the time" in text
