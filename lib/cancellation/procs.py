"""N processes for a notebook's independent work: `python -m cancellation.run NN --procs N` (issue 36, item 3).

How ranks start. The runner puts N in $CANCELLATION_PROCS for the notebook's kernel; the notebook
itself is unchanged and runs once, in that one kernel. A stage that holds independent work units
calls `fan_out(fn, shared, units)`. With N > 1 (and more than one unit) it pickles the job (the
worker function's name, what every rank shares, the units) into a private temporary folder and
starts accelerate's launcher, the one TRL uses (`python -m accelerate.commands.launch --multi_gpu
--num_processes N --main_process_port 0 --max_restarts 0 -m cancellation.procs JOB`: torch's elastic
launcher underneath, a free port per launch), as a child of the kernel. Each rank joins through
`accelerate.PartialState()` (gloo on CPU, NCCL with one rank per GPU: CUDA_VISIBLE_DEVICES narrowed to
LOCAL_RANK's device, so torch and vLLM in the rank both see it as cuda:0), takes its contiguous share
of the units (`PartialState().split_between_processes`: rank r of N gets the r-th of N near-equal
runs of units), and every rank's results are collected with `accelerate.utils.gather_object`; rank 0
alone writes them, atomically (cache.atomic_write), to the job's result file, which the kernel reads
back in unit order. Everything before and after the fanned-out stage (the batches, the GRPO steps,
the analysis, tables, figures, the claims registry) runs once, in the kernel, exactly as on one
process.

Why this shape rather than the whole notebook under `accelerate launch`: papermill, the runner's
staging folder and its all-or-nothing promotion stay as they are (one kernel, one writer); the ranks
live only for the heavy stage and load only what it needs; the launcher brings the rendezvous,
LOCAL_RANK for the GPU and stops every rank when one dies. Running the whole notebook on N ranks
would sample the batch and take the GRPO steps N times (on N GPUs not bit-equal unless every kernel
is deterministic) and make every notebook's writes rank-aware.

Results do not depend on N: a unit carries its own seeds (for the Monte Carlo continuations,
value.prefix_seed of (seed, prefix, banned token) per prefix), and a unit is cut before the
split, the same way for every N, so a rank computes exactly what one process computes for that
unit. value.cached_rewards, the one caller so far, makes a unit of each sampler batch of the
1-process run (the same prefixes in the same order), so its samples are the same bits on any N:
nothing relies on the sampler's batch invariance, which holds only up to floating-point rounding
of differently padded batches.

A unit that trains through its own Accelerator (notebook 07's TRL runs, engine trl: one whole run per
unit) runs inside its rank in a child process without the launcher's variables (`isolated`), so TRL
sees one process and the run is the one-process run, whatever N is.

A rank that raises or dies makes the launcher stop the others; `fan_out` raises RankFailed with one
line (which rank, its exit code or signal, its exception), the notebook fails, and the runner
promotes nothing.

Test hook: $CANCELLATION_PROCS_KILL=R makes rank R kill itself (SIGKILL) before its first unit.
"""
from __future__ import annotations

import importlib
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cache

PROCS_ENV = "CANCELLATION_PROCS"       # N, set by the runner (--procs N) for the notebook's kernel
RANK_ENV = "CANCELLATION_PROCS_RANK"   # set inside a rank: a rank never fans out again
KILL_ENV = "CANCELLATION_PROCS_KILL"   # test hook: this rank kills itself


# the notebooks with a stage split over processes, and what is split (the runner names them)
SPLIT = {"01_token_flipping": "the Δlog p runs (main, control, Fig. 9's models), each trained on one process",
         "04_category_shift": "the batches of both policies (each cached by its rank)",
         "05_value_gap": "Monte Carlo continuations of the valued tokens",
         "06_sampling_budget": "Monte Carlo continuations of the valued tokens; settings x seeds with step_mode grpo",
         "07_batching": "the TRL runs (engine trl: strategy x seed and the sweep's), each trained on one process"}
# the planner's split parts (workload.Work.split) that --procs really divides, per notebook: (what, how)
BUILT = {("01_token_flipping", "the model grid's GRPO runs"): "a unit is one whole run, trained on one process",
         ("01_token_flipping", "Fig. 9's runs"): "a unit is one whole run, trained on one process",
         ("04_category_shift", "batches"): "a unit is one batch of one policy",
         ("05_value_gap", "valued tokens' Monte Carlo continuations"): "a unit is a sampler batch",
         ("06_sampling_budget", "valued tokens' Monte Carlo continuations"): "a unit is a sampler batch",
         ("06_sampling_budget", "settings x seeds"): "a unit is one setting and seed, with step_mode grpo",
         ("07_batching", "TRL runs (strategy x seed)"): "a unit is one whole TRL run, trained on one process"}
# notebooks whose ranks each do whole units as one process does (01: Δlog p runs; 04: batches, each sampled,
# updated and measured; 07: TRL runs) while the kernel waits holding no model (the planner's memory)
WHOLE_RUNS = {"01_token_flipping", "04_category_shift", "07_batching"}
# the built parts whose ranks rebuild only the float policy and take GRPO steps (budget._rank_sweep); the other
# built parts of notebooks outside WHOLE_RUNS rebuild the sampler (value._rank_rewards: the float policy, then
# its sampler: a copy in sample_dtype, or a vLLM engine that keeps the float policy as its hf_model)
POLICY_RANKS = {("06_sampling_budget", "settings x seeds")}
# notebooks whose units run in a child process of their rank (`isolated`) when a Params field has this value:
# one more process, so one more CUDA context, on the rank's GPU (07's TRL runs; 01's vLLM runs, train._rank_delta_runs)
ISOLATED = {"07_batching": ("engine", "trl"), "01_token_flipping": ("backend", "vllm")}
# fan_out calls a run makes for a built part (each pays the launcher, its ranks' start and model load; the
# planner's per-process time): one, unless named here as a function of the notebook's Params (read off the
# callers: 01 trains the grid's and Fig. 9's runs in one call; 05 values tokens once per estimator, then the
# pool of 11 and the held-out tokens; 06 once per batch with valued tokens, the base and the composition batch)
FAN_OUTS = {("01_token_flipping", "Fig. 9's runs"): lambda P: 0,
            ("05_value_gap", "valued tokens' Monte Carlo continuations"):
                lambda P: len(P.estimators) + 1 + (1 if P.heldout_per_cell else 0),
            ("06_sampling_budget", "valued tokens' Monte Carlo continuations"):
                lambda P: 1 + (1 if P.comp_groups else 0)}


class RankFailed(RuntimeError):
    """A rank of a fanned-out stage raised or died; the message is one line."""


def count() -> int:
    """N of $CANCELLATION_PROCS (1 when unset, and always 1 inside a rank)."""
    if os.environ.get(RANK_ENV):
        return 1
    raw = os.environ.get(PROCS_ENV, "").strip()
    try:
        n = int(raw) if raw else 1
    except ValueError:
        raise ValueError(f"${PROCS_ENV}={raw!r}: expected a number of processes") from None
    if n < 1:
        raise ValueError(f"${PROCS_ENV}={n}: expected a number of processes >= 1")
    return n


def device_problem(n: int, devices: dict) -> str | None:
    """One line when `--procs n` cannot start: a notebook split over processes (`devices`: its stem -> its device)
    runs on CUDA, where every rank takes a GPU of its own (fan_out narrows CUDA_VISIBLE_DEVICES to LOCAL_RANK's),
    and this host shows fewer than n. Without the check a rank past the last GPU is pointed at a card that does
    not exist and fails only after the notebook's unsplit work. CPU ranks are processes on this host: any n."""
    cuda = [stem for stem, dev in devices.items() if str(dev).startswith("cuda")]
    if n <= 1 or not cuda:
        return None
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n <= have:
        return None
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"--procs {n} starts one rank per GPU, but this host has {have} visible GPU{'s' if have != 1 else ''} "
            f"(CUDA_VISIBLE_DEVICES={seen if seen is not None else 'unset'}) for {', '.join(cuda)} on CUDA: "
            f"pass --procs {max(have, 1)}{' or fewer' if have > 1 else ''}, or make more GPUs visible")


def _resolve(name: str):
    mod, _, fn = name.partition(":")
    return getattr(importlib.import_module(mod), fn)


def fan_out(fn: str, shared, units: list, n: int | None = None, cuda: bool = False, what: str = "stage") -> list:
    """`fn(shared, my_units, local_rank)` over `units` on N ranks; one result per unit, in unit order.

    `fn` is "module:function" (importable by the ranks); it returns one result per unit it gets.
    `local_rank` is None on one process and on CPU ranks; with `cuda` it is 0: each rank sees only
    its own GPU (CUDA_VISIBLE_DEVICES narrowed to LOCAL_RANK's device). Units are pickled: keep their
    tensors on the CPU. With N ≤ 1 or at most one unit, fn runs here on every unit. Never more ranks
    than units."""
    n = min(count() if n is None else n, len(units))
    if n <= 1:
        return list(_resolve(fn)(shared, list(units), None))
    problem = device_problem(n, {what: "cuda" if cuda else "cpu"})
    if problem:   # the runner refuses this before any work; a caller from Python gets it here, before the launch
        raise RankFailed(problem)
    job = Path(tempfile.mkdtemp(prefix="cancellation-procs-"))
    try:
        with open(job / "job.pkl", "wb") as f:
            pickle.dump(dict(fn=fn, shared=shared, units=list(units), cuda=bool(cuda)), f)
        env = dict(os.environ)
        env.pop(PROCS_ENV, None)
        pkg = str(Path(__file__).resolve().parents[1])   # the ranks import this very package
        env["PYTHONPATH"] = os.pathsep.join([pkg] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        cmd = launch_command(n) + ["-m", "cancellation.procs", str(job)]
        t0 = time.perf_counter()
        # the ranks' own output goes to the job's log: say here what runs, as the stage may take minutes
        print(f"[procs] {what}: {len(units)} units on {n} processes, started at {time.strftime('%H:%M:%S')}", flush=True)
        with open(job / "log.txt", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                rc = proc.wait()
            finally:
                if proc.poll() is None:   # Ctrl-C / SIGTERM in the kernel: the launcher stops its ranks
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
        if rc != 0 or not (job / "result.pkl").exists():
            raise RankFailed(_failure_line(job, n, rc, what))
        with open(job / "result.pkl", "rb") as f:
            out = pickle.load(f)
        print(f"[procs] {what}: {len(units)} units on {n} processes, {time.perf_counter() - t0:.0f} s", flush=True)
        return out
    finally:
        shutil.rmtree(job, ignore_errors=True)


# what a rank's environment holds from the launcher: a unit that trains through its own Accelerator (TRL) runs
# in a child without them, so the child is one process, not a member of the ranks' group
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def isolated(fn: str, *args):
    """`fn(*args)` ("module:function") in a child process of this one with the launcher's variables removed
    (LAUNCHER_ENV, TORCHELASTIC_*, ACCELERATE_*): inside a rank, a unit that starts its own Accelerator (a TRL
    run) trains there as one process, exactly as on one process. Arguments and result are pickled; a child
    that raises or dies raises RuntimeError with its last line."""
    job = Path(tempfile.mkdtemp(prefix="cancellation-unit-"))
    try:
        with open(job / "call.pkl", "wb") as f:
            pickle.dump(dict(fn=fn, args=args), f)
        env = {k: v for k, v in os.environ.items()
               if k not in LAUNCHER_ENV and not k.startswith(("TORCHELASTIC_", "ACCELERATE_"))}
        with open(job / "log.txt", "wb") as log:
            rc = subprocess.run([sys.executable, "-m", "cancellation.procs", "--isolated", str(job)], env=env,
                                stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0 or not (job / "result.pkl").exists():
            err = job / "error.txt"
            last = [ln for ln in (job / "log.txt").read_text(errors="replace").splitlines() if ln.strip()]
            raise RuntimeError(err.read_text().strip() if err.exists() else
                               f"{fn}: the child process exited with code {rc}{': ' + last[-1][:200] if last else ''}")
        with open(job / "result.pkl", "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _isolated_child(job: Path) -> None:
    with open(job / "call.pkl", "rb") as f:
        call = pickle.load(f)
    try:
        out = _resolve(call["fn"])(*call["args"])
    except BaseException as e:
        text = str(e).strip().splitlines()
        (job / "error.txt").write_text(f"{type(e).__name__}: {text[0] if text else ''}\n")
        raise

    def write(tmp):
        with open(tmp, "wb") as f:
            pickle.dump(out, f)
    cache.atomic_write(job / "result.pkl", write)


def launch_command(n: int) -> list[str]:
    """accelerate's launcher for `n` processes on this host, up to the script: one rank per GPU (NCCL) or,
    on a host without CUDA, `n` CPU processes joined with gloo (`--multi_gpu` is accelerate's torch-elastic
    launcher; `--cpu` would start one process without MPI); a free port per launch, no restarts, no
    mixed precision or dynamo (a rank computes exactly what one process computes)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
            "--num_processes", str(n), "--main_process_port", "0", "--max_restarts", "0",
            "--mixed_precision", "no", "--dynamo_backend", "no"]


def _failure_line(job: Path, n: int, rc: int, what: str) -> str:
    """One line: which rank failed, how, and its exception when it raised one."""
    errs = sorted(job.glob("rank*.error"))
    if errs:
        r = errs[0].stem.removeprefix("rank")
        return f"{what}: rank {r} of {n} failed: {errs[0].read_text().strip()}; no outputs were written"
    log = (job / "log.txt").read_text(errors="replace") if (job / "log.txt").exists() else ""
    root = log[log.find("Root Cause"):] if "Root Cause" in log else log
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    how = f"exit code {code.group(1)}" if code else f"launcher exit code {rc}"
    if code and int(code.group(1)) < 0:
        try:
            how += f" ({signal.Signals(-int(code.group(1))).name})"
        except ValueError:
            pass
    if rank:
        return f"{what}: rank {rank.group(1)} of {n} died ({how}); no outputs were written"
    last = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return f"{what}: the {n}-process launcher failed ({how}){': ' + last[-1][:200] if last else ''}; " \
           "no outputs were written"


def _worker(job: Path) -> None:
    """One rank (started by accelerate's launcher): its share of the units, gathered on every rank
    (accelerate's gather_object); rank 0 writes them."""
    with open(job / "job.pkl", "rb") as f:
        spec = pickle.load(f)
    local = int(os.environ["LOCAL_RANK"])
    os.environ[RANK_ENV] = os.environ["RANK"]
    if spec["cuda"]:  # this rank sees only its own GPU (before CUDA starts): vLLM and torch both use cuda:0
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[local] if local < len(visible) else str(local)
        os.environ["LOCAL_RANK"] = "0"   # accelerate places the rank on cuda:LOCAL_RANK: its only device
    from accelerate import PartialState
    from accelerate.utils import gather_object

    state = PartialState(cpu=not spec["cuda"], backend=None if spec["cuda"] else "gloo")   # CPU: gloo, not MPI
    rank = state.process_index
    if os.environ.get(KILL_ENV, "") == str(rank):
        os.kill(os.getpid(), signal.SIGKILL)
    units = spec["units"]
    with state.split_between_processes(list(range(len(units)))) as mine:
        mine = list(mine)
    try:
        res = list(_resolve(spec["fn"])(spec["shared"], [units[i] for i in mine], 0 if spec["cuda"] else None))
        if len(res) != len(mine):
            raise RuntimeError(f"{spec['fn']} returned {len(res)} results for {len(mine)} units")
    except BaseException as e:
        text = str(e).strip().splitlines()
        line = f"{type(e).__name__}: {text[0] if text else ''}\n"
        cache.atomic_write(job / f"rank{rank}.error", lambda tmp: Path(tmp).write_text(line))
        raise
    got = gather_object([(mine, res)])   # one (unit indices, results) per rank, in rank order, on every rank
    if rank == 0:
        out = [None] * len(units)
        for idx, r in got:
            for i, x in zip(idx, r):
                out[i] = x

        def write(tmp):
            with open(tmp, "wb") as f:
                pickle.dump(out, f)
        cache.atomic_write(job / "result.pkl", write)
    state.wait_for_everyone()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # gloo can abort a rank at interpreter teardown even after destroy_process_group


# ----------------------------------------------------------------------------- a probe (tests)
def _probe(shared, units, local_rank):
    """Test worker: each unit squared, plus the rank that computed it ($RANK, 0 on one process)."""
    if shared.get("raise_on") in units:
        raise ValueError(f"probe refused unit {shared['raise_on']}")
    return [(u * u, int(os.environ.get("RANK", 0))) for u in units]


if __name__ == "__main__":
    if sys.argv[1] == "--isolated":
        _isolated_child(Path(sys.argv[2]))
    else:
        _worker(Path(sys.argv[1]))
