"""`--cores N`: CPU notebooks side by side. Which notebooks run together (`segments`: each run of consecutive
CPU notebooks is one pool), how many cores each keeps busy (`cpu_threads`), the order a pool starts them in
(`pool_order`) and the pool itself (`run_pool`: each notebook in its own `python -m cancellation.run`
process, a log each, a heartbeat, signals passed on once).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import staging
from .execute import is_tqdm_notice
from .profiles import Checkout, here


def cpu_threads(params: dict) -> int | None:
    """The CPU cores a notebook keeps busy: its `threads` (every figure pins them: base.pin_threads) x
    `workers` on the CPU; None (it runs alone) on an accelerator or without a `threads` parameter."""
    if str(params.get("device", "cpu")) != "cpu" or "threads" not in params:
        return None
    workers = params.get("workers", 1) if params.get("engine", "small") == "small" else 1
    return int(params["threads"]) * int(workers)


def segments(resolved: list, cores: int) -> list[list]:
    """`resolved` (notebook, params) pairs in order, cut into what runs together: with `cores` > 1, each
    run of consecutive CPU notebooks is one pool (`run_pool`: started while their threads,
    `cpu_threads`, fit in `cores`); a notebook on an accelerator, and every notebook with `cores` 1, is a
    segment of its own and runs in the runner's process (its output live in the terminal)."""
    out: list[list] = []
    for nb, params in resolved:
        pooled = cores > 1 and cpu_threads(params) is not None
        if pooled and out and out[-1][0][2]:
            out[-1].append((nb, params, True))
        else:
            out.append([(nb, params, pooled)])
    return [[(nb, params) for nb, params, _ in seg] for seg in out]


STAGGER_S = 5.0    # between two starts: kernels that start apart do not race for ports (run_notebook retries)
HEARTBEAT_S = 60.0  # how often a pool prints where each running notebook is


def _last_line(log: Path) -> str:
    """The last non-blank line of a child's log, a progress bar's latest state included (tqdm ends its
    updates with a carriage return, not a newline)."""
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        tail = f.read().decode(errors="replace")
    lines = [ln.strip() for ln in re.split(r"[\r\n]", tail) if ln.strip() and not is_tqdm_notice(ln)]
    return lines[-1][:120] if lines else ""



def pool_order(group: list, expected: dict) -> list:
    """The order a pool starts `group`'s (notebook, params) pairs in: the widest first (a notebook that needs
    every core can start only on an empty pool, so waiting for it later would leave cores idle while the pool
    drains), then the longest first by the planner's `expected` seconds (the long ones do not start last and
    run alone at the end), ties and notebooks without an estimate in notebook order."""
    return sorted(group, key=lambda x: (-cpu_threads(x[1]), -expected.get(x[0].stem, 0.0)))


def run_pool(group: list, a, share: dict, expected: dict | None = None, checkout: Checkout | None = None) -> int:
    """The notebooks of `group`, each in its own `python -m cancellation.run` process, started while their
    threads (`cpu_threads`) fit in `a.cores`, in `pool_order` (the widest, then the longest by the plans'
    `expected` seconds, first).
    Each writes its log to .run-staging/logs/<notebook>.log; every HEARTBEAT_S the pool prints each running
    notebook's latest line; a finished one prints its last line, a failed one its log's tail, and no
    further notebook starts. Returns the first failure's exit status (1, 130, 143), 0 when all ran through.
    Each child runs in a session of its own, so a signal reaches it once, from the runner: Ctrl-C in the
    terminal or `kill -INT <runner's pid>` is passed on as SIGINT, SIGTERM as SIGTERM. Either way every
    child restores its own outputs before the runner returns, and none outlives it. `a`: the command line's
    cores, profile and replace; `checkout`: whose notebooks and outputs (default HERE), each child's --root."""
    co = here(checkout)
    logs = co.root / staging.STAGING / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # an owner record keeps staging.clear_stale (in the children) from removing the logs of a live run
    (logs / "owner.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    queue = pool_order(group, expected or {})
    running, rc, t0 = {}, 0, time.time()
    threads = ", ".join(f"{nb.stem[:2]} {cpu_threads(p)}" for nb, p in group)
    print(f"[run] {len(group)} notebooks in a pool of {a.cores} cores, started while their threads fit, the widest "
          f"first ({threads}), then the longest by the plan: {', '.join(nb.stem[:2] for nb, _ in queue)}; logs in "
          f"{co.show(logs)}/", flush=True)
    beat = time.time()
    try:
        while queue or running:
            used = sum(need for _, need, _, _ in running.values())
            if queue and not rc and (not running or used + cpu_threads(queue[0][1]) <= a.cores):
                nb, params = queue.pop(0)
                if running:
                    time.sleep(STAGGER_S)
                cmd = [sys.executable, "-m", "cancellation.run", nb.stem, "--profile", a.profile, "--root",
                       str(co.root), "--no-plan-check"]  # every plan was checked above
                for k, v in share[nb].items():
                    cmd += ["-p", k, v if isinstance(v, str) else json.dumps(v)]  # as typed (JSON is YAML 1.2)
                if a.replace:
                    cmd.append("--replace")
                log = open(logs / f"{nb.stem}.log", "w")
                print(f"[run] {nb.stem} started ({cpu_threads(params)} of {a.cores} cores)", flush=True)
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                running[nb.stem] = (proc, cpu_threads(params), log, time.time())
                continue
            if queue and rc:
                print(f"[run] not started after the failure: {', '.join(nb.stem for nb, _ in queue)}",
                      file=sys.stderr, flush=True)
                queue = []
            time.sleep(0.5)
            if time.time() - beat >= HEARTBEAT_S:
                beat = time.time()
                for stem, (_, _, _, since) in running.items():
                    print(f"[run] {stem} running {time.time() - since:.0f} s: {_last_line(logs / f'{stem}.log')}",
                          flush=True)
            for stem, (proc, _, log, _) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[stem]
                text = (logs / f"{stem}.log").read_text(errors="replace").splitlines()
                if proc.returncode:
                    rc = rc or proc.returncode
                    print(f"[run] {stem} FAILED (exit {proc.returncode}); the end of its log "
                          f"({co.show(logs / f'{stem}.log')}):\n  " + "\n  ".join(text[-15:]), file=sys.stderr, flush=True)
                else:
                    done = [ln for ln in text if ln.startswith("[run]") and " done in " in ln]
                    print(done[-1] if done else f"[run] {stem} done", flush=True)
    except KeyboardInterrupt:  # the children are in sessions of their own: pass the signal on, once each
        sig = signal.SIGTERM if isinstance(sys.exc_info()[1], staging.Terminated) else signal.SIGINT
        for proc, _, _, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(sig)
        for proc, _, log, _ in running.values():
            proc.wait()
            log.close()
        raise
    print(f"[run] {len(group)} notebooks in {time.time() - t0:.0f} s on {a.cores} cores", flush=True)
    return rc
