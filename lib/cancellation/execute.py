"""A notebook executed: jupytext (.py percent) -> papermill -> executed .ipynb, all or nothing
(cancellation.staging: it writes into .run-staging/, whose figures, tables and executed notebook are moved
into place only when it ran through). Its kernel (environment, stderr, port retries), the executed
notebook made to depend on results only, and the short summaries of a failure or an interrupt.
papermill, jupytext and jupyter_client are imported where a notebook is prepared or run.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import time
from pathlib import Path

from . import staging
from .profiles import INJECTED, Checkout, figure_params, find_notebook, here
from .resolve import output_dirs, resolve_params

ONE_LINE_STOPS = ("NoSignal", "UnrewardableGolds", "RankFailed")  # notebook errors whose message is the whole outcome


def _is_progress(out: dict) -> bool:
    """A stderr stream of progress-bar redraws (tqdm writes '\r...it/s]'), tqdm's IProgress notice, or the bare
    newline a closed bar leaves (a run that computed shows it, one that read the cache does not)."""
    if out.get("output_type") != "stream" or out.get("name") != "stderr":
        return False
    text = "".join(out.get("text", []))
    return text.startswith("\r") or not text.strip() or is_tqdm_notice(text)


def is_tqdm_notice(line: str) -> bool:
    """A line of tqdm's IProgress notice (two lines every kernel prints once on importing tqdm.auto)."""
    return "TqdmWarning: IProgress not found" in line or "from .autonotebook import tqdm" in line


def _renamed(x, renames: dict):
    """`x` (a notebook's JSON) with every string's staging paths replaced by the final ones."""
    if isinstance(x, str):
        for a, b in renames.items():
            x = x.replace(a, b)
        return x
    if isinstance(x, list):
        return [_renamed(v, renames) for v in x]
    if isinstance(x, dict):
        return {k: _renamed(v, renames) for k, v in x.items()}
    return x


def _strip_volatile(path: Path, renames: dict | None = None):
    """Make an executed notebook depend on results only: drop the timing metadata papermill writes and
    progress-bar redraws (a reader sees results, not hundreds of tqdm frames), number the cells
    `cell-000`, `cell-001`, ... (papermill gives its injected-parameters cell a random id), and
    replace staging paths by the final ones (`renames`), so a rerun leaves git clean."""
    nb = json.loads(Path(path).read_text())
    nb.get("metadata", {}).pop("papermill", None)
    for i, c in enumerate(nb.get("cells", [])):
        c.get("metadata", {}).pop("papermill", None)
        c.get("metadata", {}).pop("execution", None)
        if "outputs" in c:
            c["outputs"] = [o for o in c["outputs"] if not _is_progress(o)]
        if "id" in c or nb.get("nbformat", 4) > 4 or nb.get("nbformat_minor", 0) >= 5:
            c["id"] = f"cell-{i:03d}"
    if renames:
        nb = _renamed(nb, dict(sorted(renames.items(), key=lambda kv: -len(kv[0]))))  # longest (absolute) first
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


# The dry run's last cell: the kernel's own peak memory, for the runner's record (dry runs only).
_PEAK_CELL = """# dry run: this process's peak memory, for the runner's record
import json as _json, resource as _resource, torch as _torch
_json.dump({"peak_rss_gib": _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "peak_cuda_gib": _torch.cuda.max_memory_allocated() / 2**30 if _torch.cuda.is_available() else None},
           open(%r, "w"))"""


def _prepare(nb_path: Path, dest: Path, meta: dict, peak_file: Path | None = None):
    """The .ipynb papermill executes: jupytext's conversion of the .py notebook, a python3 kernelspec,
    the run's metadata and cell ids numbered from the cell's index (deterministic, unlike jupytext's);
    with `peak_file` (a dry run) a last cell that writes the kernel's peak memory there."""
    import jupytext
    import nbformat
    nb = jupytext.read(nb_path)
    if peak_file is not None:
        nb.cells.append(nbformat.v4.new_code_cell(_PEAK_CELL % str(peak_file)))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["cancellation"] = meta
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:03d}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(nb, dest)


class NotebookFailed(RuntimeError):
    """A notebook raised: the message names the notebook, the failing cell and the one-line cause."""


class NotebookInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a notebook: the message says which and where its partial notebook is."""

    def __init__(self, message: str, rc: int = 130):
        super().__init__(message)
        self.rc = rc


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _failure_summary(name: str, e, kept: Path | None, checkout: Checkout | None = None) -> str:
    """Failing cell's head and the one-line cause of a papermill error (not the whole traceback)."""
    ename, evalue = getattr(e, "ename", type(e).__name__), _ANSI.sub("", str(getattr(e, "evalue", e)))
    cause = f"{ename}: {evalue.strip().splitlines()[0] if evalue.strip() else ''}".rstrip(": ")
    src = (getattr(e, "source", "") or "").splitlines()
    lines = [f"{name} failed" + (f" in cell {e.cell_index}" if getattr(e, "cell_index", None) is not None else "")
             + ":"]
    tb = "\n".join(_ANSI.sub("", t) for t in (getattr(e, "traceback", None) or []))
    at = re.search(r"^-*> ?(\d+)", tb, re.M)  # IPython marks the failing line of the cell with ---->
    head = [ln for ln in src if ln.strip()][:3]
    lines += [f"    | {ln}" for ln in head] + (["    | ..."] if len([ln for ln in src if ln.strip()]) > 3 else [])
    if at and 0 < int(at.group(1)) <= len(src):
        lines.append(f"  at line {at.group(1)}: {src[int(at.group(1)) - 1].strip()}")
    lines.append(f"  {cause}")
    if kept is not None:
        lines.append(f"  the notebook as far as it ran: {here(checkout).show(kept)}")
    return "\n".join(lines)


def _interrupt_summary(name: str, e: BaseException, kept: Path | None, checkout: Checkout | None = None) -> str:
    how = "terminated (SIGTERM)" if isinstance(e, staging.Terminated) else "interrupted (Ctrl-C)"
    lines = [f"{name} {how}; its figures, tables and executed notebook are unchanged"]
    if kept is not None:
        lines.append(f"  the notebook as far as it ran: {here(checkout).show(kept)}")
    return "\n".join(lines)


class _DropTeardownNoise(logging.Filter):
    """What nbclient's teardown logs when a run ends in a dead kernel or an interrupt, which Python's
    last-resort handler prints bare on stderr: "Kernel died while waiting for execute reply." (papermill's
    logger, before nbclient raises) and asyncio's "Task exception was never retrieved" with a traceback
    (one of nbclient's tasks, collected later). The runner reports both outcomes itself: a dead kernel's
    summary with the kernel's own stderr, or the interrupt's two lines. Seen on a slow 2-core machine
    under a second pytest worker: the Ctrl-C test got one or the other on top of its two lines."""
    NOISE = ("Kernel died while waiting for execute reply", "Task exception was never retrieved")

    def filter(self, record):
        return not record.getMessage().startswith(self.NOISE)


TEARDOWN_NOISE = _DropTeardownNoise()


@contextlib.contextmanager
def _quiet_teardown_noise():
    """The teardown noise dropped while a notebook runs; after a run that raised (a dead kernel, an
    interrupt) asyncio's stays dropped for the rest of this process, since nbclient's tasks are reported
    when they are collected, which can be later."""
    papermill_log, asyncio_log = logging.getLogger("papermill"), logging.getLogger("asyncio")
    papermill_log.addFilter(TEARDOWN_NOISE)
    asyncio_log.addFilter(TEARDOWN_NOISE)
    ok = False
    try:
        yield
        ok = True
    finally:
        papermill_log.removeFilter(TEARDOWN_NOISE)
        if ok:
            asyncio_log.removeFilter(TEARDOWN_NOISE)


def _disk_full(e: BaseException | None) -> OSError | None:
    """The 'no space left on device' error in `e`'s chain of causes, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        e = e.__cause__ or e.__context__
    return None


def _disk_full_line(name: str, e: OSError, where: Path) -> str:
    return (f"{name} stopped: the disk is full (no space left writing {getattr(e, 'filename', None) or where}); "
            "its figures, tables and executed notebook are unchanged: free some space and run it again")


def _keep_failed(tmp: Path, failed: Path, renames: dict) -> Path | None:
    """The partial executed notebook moved to `failed` (None when papermill wrote nothing, or wrote a
    notebook cut off part way, e.g. on a full disk: nothing readable to keep)."""
    if not (tmp.exists() and tmp.stat().st_size):
        return None
    try:
        _strip_volatile(tmp, renames)
    except (ValueError, OSError):   # json's JSONDecodeError is a ValueError: a half-written file
        return None
    os.chmod(tmp, 0o666 & ~_UMASK)
    staging.replace_file(tmp, failed)
    return failed


# glibc malloc in the kernel: blocks up to 1 GiB come from the heap and stay there when freed. By default a
# block over 32 MiB is mmap'ed and unmapped on free, so a loop over (token_chunk x vocabulary) logits chunks
# (156 MB each at Qwen's 151,936-wide head and 256 positions) faults every page in afresh on every call.
# Measured on 2 cores (test_paper_vocab): 07 177 s -> 118 s (sys 80 s -> 20 s), 02 52 s -> 42 s; no change
# on the tiny profile, whose tensors are small. A value the user set wins; other C libraries ignore them.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def kernel_env() -> dict:
    """The environment a notebook's kernel starts with: this process's, plus MALLOC_ENV where unset."""
    return {**MALLOC_ENV, **os.environ}


def _kernel_manager(stderr):
    """jupyter_client's AsyncKernelManager, with the kernel process's own stderr (IPKernelApp's log:
    its TCP warning, teardown tracebacks after Ctrl-C, a crash's last words) going to the open file
    `stderr` instead of the terminal, and `kernel_env()` as its environment. Cell outputs come through
    the notebook as before."""
    from jupyter_client import AsyncKernelManager

    class KernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stderr", stderr)
            kw.setdefault("env", kernel_env())
            return await super().start_kernel(**kw)

    return KernelManager


# jupyter_client picks a kernel's ports free, then the kernel binds them: a kernel another process starts
# at the same moment (05 and 06 side by side) can take one in between. Nothing has run then: start again.
PORT_RETRIES = 3


def _port_taken(klog: Path) -> bool:
    """The kernel died binding a port another process took (its stderr says so)."""
    try:
        return "Address already in use" in klog.read_text(errors="replace")
    except OSError:
        return False


def _kernel_log_tail(path: Path, n: int = 5) -> list[str]:
    """The last lines of a kernel's stderr worth showing (not IPKernelApp's TCP warning)."""
    try:
        lines = [ln.rstrip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return []
    return [ln for ln in lines if ln.strip() and "without encryption" not in ln][-n:]


def run_notebook(ref: str, profile: str = "tiny", overrides: dict | None = None, out_root: Path | None = None,
                 log_output: bool = True, *, replace: bool = False, cwd: str | Path | None = None,
                 peak_file: Path | None = None, replot: bool = False, checkout: Checkout | None = None) -> Path:
    """Execute one notebook; returns the executed .ipynb path.

    `replot`: the notebook reads its Result back from the tables of its results folder (the one this run would
    write) and computes nothing (`figures/replot.py`): figures, claims and the executed notebook are redrawn,
    the tables are left as they are.

    Outputs go to the profile's directories (figures/<profile>, data/results/<profile>,
    notebooks/executed/<profile>, under out_root when given), or, for a run with overrides, to
    `runs/<hash of the overrides>/` below each unless `replace`. All or nothing: the notebook writes
    into a staging folder (staging.Staging, passed as its fig_dir/results_dir), whose figures, tables
    and executed notebook are moved into place only when it ran through. A failed run leaves the
    outputs as they were plus `<name>.failed.ipynb` and raises NotebookFailed with a short summary;
    Ctrl-C / SIGTERM raise NotebookInterrupted. The staging folder is removed on every exit. `checkout`: whose
    notebooks, profiles and outputs (default HERE); the kernel runs in its root.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    co = here(checkout)
    nb_path = find_notebook(ref, co)
    ov: dict = {}
    params = resolve_params(nb_path, profile, overrides, out_root, cwd=cwd, check_paths=True, replace=replace,
                            resolved_overrides=ov, checkout=co)
    root = Path(out_root) if out_root else co.root
    final = {k: Path(v) if Path(v).is_absolute() else co.root / v
             for k, v in output_dirs(profile, ov, out_root, replace, co).items()}
    out = final["executed_dir"] / f"{nb_path.stem}.ipynb"
    failed = final["executed_dir"] / f"{nb_path.stem}.failed.ipynb"
    staging.clear_stale(root)
    with staging.sigterm_raises(), staging.Staging(root, nb_path.stem, final) as st:
        run_params, renames = dict(params), {}
        if figure_params(nb_path) is not None:  # the notebook builds figNN.Params(**params)
            run_params = {k: v for k, v in params.items() if k in INJECTED}
            run_params["params"] = {k: v for k, v in params.items() if k not in INJECTED}
        for k in ("fig_dir", "results_dir"):
            if k in params:  # the notebook writes into the staging folder; its record names the final one
                run_params[k] = co.show(st.dirs[k]) if out_root is None else str(st.dirs[k])
                renames.update({run_params[k]: params[k], str(st.dirs[k]): str(final[k])})
        if replot:   # the tables it reads: the final folder's (the staging folder holds only the claims registry)
            if "replot" not in params:
                raise NotebookFailed(f"{nb_path.stem} has no `replot` parameter: it cannot be redrawn without "
                                     f"recomputing")
            run_params["replot"] = str(params["results_dir"])
        src, tmp = st.dir / "source" / f"{nb_path.stem}.ipynb", st.dirs["executed_dir"] / f"{nb_path.stem}.ipynb"
        try:
            _prepare(nb_path, src, {"profile": profile, "overrides": ov, "replace": bool(replace and ov),
                                    "fig_dir": params.get("fig_dir"), "results_dir": params.get("results_dir"),
                                    **({"replot": True} if replot else {})},
                     peak_file)
        except OSError as e:
            if _disk_full(e) is None:
                raise
            raise NotebookFailed(_disk_full_line(nb_path.stem, e, st.dir)) from None
        t0 = time.time()
        # where it really goes: a dry run's (or another out_root's) notebook is not under notebooks/executed/
        print(f"[run] {nb_path.name} profile={profile} -> {co.show(out)}", flush=True)
        klog = st.dir / "kernel.stderr"
        try:
            for attempt in range(PORT_RETRIES + 1):
                klog.write_bytes(b"")
                try:
                    with open(klog, "ab") as kernel_stderr, _quiet_teardown_noise():
                        pm.execute_notebook(str(src), str(tmp), parameters=run_params, kernel_name="python3",
                                            cwd=str(co.root), progress_bar=False, log_output=log_output,
                                            stdout_file=None, kernel_manager_class=_kernel_manager(kernel_stderr))
                    break
                except Exception as e:  # noqa: BLE001
                    if attempt == PORT_RETRIES or isinstance(e, PapermillExecutionError) or not _port_taken(klog):
                        raise
                    print(f"[run] {nb_path.stem}: another process took the kernel's port as it started; starting "
                          f"it again ({attempt + 1}/{PORT_RETRIES})", flush=True)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (staging.Terminated)
            kept = _keep_failed(tmp, failed, renames)
            raise NotebookInterrupted(_interrupt_summary(nb_path.stem, e, kept, co),
                                      143 if isinstance(e, staging.Terminated) else 130) from None
        except Exception as e:  # noqa: BLE001 - papermill, kernel death
            full = _disk_full(e)
            if full is not None:   # one line, not papermill's traceback and a JSONDecodeError on the cut-off file
                raise NotebookFailed(_disk_full_line(nb_path.stem, full, st.dir)) from None
            if isinstance(e, PapermillExecutionError) and getattr(e, "ename", "") in ONE_LINE_STOPS:
                _keep_failed(tmp, failed, renames)   # no reward signal, golds refused, a rank died: one line is the outcome
                raise NotebookFailed(f"{nb_path.stem} stopped: {_ANSI.sub('', str(e.evalue)).strip()}") from None
            msg = _failure_summary(nb_path.stem, e, _keep_failed(tmp, failed, renames), co)
            if isinstance(e, PapermillExecutionError):
                raise NotebookFailed(msg) from None
            tail = _kernel_log_tail(klog)  # a dead kernel's cause is in its own stderr
            msg += "".join(f"\n  kernel: {ln}" for ln in tail)
            raise NotebookFailed(msg) from (None if "Kernel" in type(e).__name__ else e)
        print(f"[run] {nb_path.name} done in {time.time() - t0:.0f} s", flush=True)
        _strip_volatile(tmp, renames)
        os.chmod(tmp, 0o666 & ~_UMASK)
        try:
            st.promote()  # figures, tables, then the executed notebook: the old outputs or all the new ones
        except staging.PromotionError as e:
            raise NotebookFailed(f"{nb_path.stem} ran through but its outputs could not be promoted: {e}; its "
                                 f"figures, tables and executed notebook are unchanged") from None
        failed.unlink(missing_ok=True)
    if ov and not replace:
        print(f"[run] a run with overrides {ov}: outputs in {co.show(final['executed_dir'])}, {params.get('fig_dir')}, "
              f"{params.get('results_dir')} (--replace writes the canonical outputs)", flush=True)
    return out


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_UMASK = _umask()
