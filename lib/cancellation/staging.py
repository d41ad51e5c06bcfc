"""All-or-nothing outputs of one notebook run (used by `cancellation.run`).

A run writes its figures, tables and executed notebook into a staging folder,
`<root>/.run-staging/<notebook>.<token>/{figures,results,executed}/`, and `Staging.promote` moves
them into the profile's directories only when the notebook ran through; a failure part way
leaves the committed outputs as they were. The staged results folder starts with a copy of the
existing `claims.parquet` (claims.record rewrites that registry read-modify-write), and promotion
merges it with rows that another run promoted meanwhile. Promotion itself is all or nothing:
every destination is checked (writable, room) before the first move, and a move failing part
way puts back what already moved (PromotionError, one line), so the canonical outputs are never
a mix of two runs.

The staging folder is removed on every exit of the `with Staging(...)` block; `sigterm_raises`
turns SIGTERM into an exception so that this cleanup runs when a run is killed politely.
Folders left by runs killed outright (SIGKILL, power loss) are removed by `clear_stale` at the
next run's start and by `make clean`.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from . import cache
from pathlib import Path

STAGING = ".run-staging"  # under the repository root (gitignored)
CLAIMS = "claims.parquet"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that `finally` blocks (and the staging cleanup) run."""


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises Terminated (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated("terminated (SIGTERM)")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def signals_deferred():
    """Ctrl-C and SIGTERM wait until the block is done (promotion is a handful of renames)."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_stale(root: str | Path, min_age_s: float = 60.0) -> list[Path]:
    """Remove staging folders of runs on this host whose process is gone (and folders without an
    owner record older than `min_age_s`), and executed-notebook temporaries `.*.tmp.ipynb` of older
    runners. Returns what was removed."""
    root = Path(root)
    gone = []
    for d in sorted((root / STAGING).glob("*")):
        if not d.is_dir():
            continue
        try:
            owner = json.loads((d / "owner.json").read_text())
            stale = owner.get("host") == socket.gethostname() and not _alive(int(owner["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            try:
                stale = time.time() - d.stat().st_mtime > min_age_s
            except OSError:
                continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    for f in (root / "notebooks" / "executed").glob("**/.*.tmp.ipynb"):
        with contextlib.suppress(OSError):
            f.unlink()
            gone.append(f)
    return gone


def replace_file(src: Path, dst: Path):
    """Move `src` onto `dst` atomically (rename; a copy then rename across filesystems)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.tmp")
        try:
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        src.unlink()


class PromotionError(OSError):
    """The outputs of a run that ran through could not be moved into place; none were (one line)."""


def _backup(dst: Path) -> Path | None:
    """A hidden hard link (a copy where links fail) of the file at `dst` beside it, or None."""
    if not (dst.exists() or dst.is_symlink()):
        return None
    b = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.bak")
    try:
        os.link(dst, b, follow_symlinks=False)
    except OSError:
        shutil.copy2(dst, b, follow_symlinks=False)
    return b


def _rollback(done: list) -> list[Path]:
    """Put back what `promote` moved (newest first); the paths that could not be restored."""
    failed = []
    for dst, backup in reversed(done):
        try:
            if backup is not None:
                os.replace(backup, dst)
                backup.unlink(missing_ok=True)  # rename between two links of one file does nothing
            else:
                dst.unlink(missing_ok=True)
        except OSError:
            failed.append(dst)
    return failed


class Staging:
    """The staging folder of one run: `dirs[name]` (fig_dir, results_dir, executed_dir) stand in for
    `final[name]` until `promote`; everything is removed when the `with` block exits."""

    NAMES = {"fig_dir": "figures", "results_dir": "results", "executed_dir": "executed"}

    def __init__(self, root: str | Path, name: str, final: dict):
        self.root = Path(root)
        self.final = {k: Path(final[k]) for k in self.NAMES}
        self.dir = self.root / STAGING / f"{name}.{secrets.token_hex(4)}"
        self.dirs = {k: self.dir / v for k, v in self.NAMES.items()}
        self.dir.mkdir(parents=True)
        (self.dir / "owner.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
        for d in self.dirs.values():
            d.mkdir()
        claims = self.final["results_dir"] / CLAIMS
        self._seed = self.dir / f"seed.{CLAIMS}"
        if claims.exists():  # the registry's other notebooks' rows survive promotion
            shutil.copy2(claims, self._seed)
            shutil.copy2(claims, self.dirs["results_dir"] / CLAIMS)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _moves(self) -> list[tuple[str, Path, Path]]:
        """(kind, staged file, final path) of every output, in promotion order (figures, tables and
        claims, then the executed notebook)."""
        out = []
        for k in ("fig_dir", "results_dir", "executed_dir"):
            src, dst = self.dirs[k], self.final[k]
            for f in sorted(p for p in src.rglob("*") if p.is_file() or p.is_symlink()):
                if f.suffix == ".lock":  # a registry's lock file (cache.lock) is no output
                    continue
                out.append((k, f, dst / f.relative_to(src)))
        return out

    def check_destinations(self, moves=None):
        """PromotionError (one line) unless every destination directory exists or can be made, takes
        a new file, and (on another filesystem than the staging folder) has room for what goes there."""
        moves = self._moves() if moves is None else moves
        need: dict[Path, int] = {self.final[k]: 0 for k in self.NAMES}
        for _, f, dst in moves:
            if dst.is_dir() and not dst.is_symlink():
                raise PromotionError(f"{dst} is a directory; expected a file there")
            need[dst.parent] = need.get(dst.parent, 0) + (f.lstat().st_size if f.exists() else 0)
        here = os.stat(self.dir).st_dev
        for d, size in need.items():
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd, probe = tempfile.mkstemp(dir=d, prefix=".promote-probe.", suffix=".tmp")
                os.close(fd)
                os.unlink(probe)
            except OSError as e:
                raise PromotionError(f"{d}: not writable ({e.strerror or type(e).__name__})") from None
            if os.stat(d).st_dev != here:  # moved by copy: the copy needs the room
                free = shutil.disk_usage(d).free
                if free < size + (1 << 20):
                    raise PromotionError(f"{d}: {free} bytes free; the run's outputs there need {size} bytes")

    def promote(self):
        """Move every staged file onto its final path (figures, tables, claims, then the notebook), all
        or nothing: every destination is checked first (PromotionError, nothing moved), and when a
        move fails part way the files already moved are put back as they were (PromotionError)."""
        with signals_deferred():
            moves = self._moves()
            self.check_destinations(moves)
            done: list[tuple[Path, Path | None]] = []  # (final path, backup of the file it replaced or None)
            try:
                for k, f, dst in moves:
                    backup = _backup(dst)
                    done.append((dst, backup))
                    if k == "results_dir" and f == self.dirs[k] / CLAIMS:
                        self._promote_claims(f, dst)
                    else:
                        replace_file(f, dst)
            except Exception as e:  # noqa: BLE001 - whatever failed, nothing may stay half promoted
                failed = _rollback(done)
                why = f"{getattr(e, 'filename', None) or dst}: {e.strerror or e}" if isinstance(e, OSError) \
                    else f"{type(e).__name__}: {e}"
                raise PromotionError(f"moving the outputs into place failed ({why}); every output already moved "
                                     f"was put back" + (f" except {', '.join(map(str, failed))}" if failed else "")) \
                    from None
            for _, backup in done:
                if backup is not None:
                    backup.unlink(missing_ok=True)

    def _promote_claims(self, staged: Path, final: Path):
        """The staged registry, with the rows of notebooks this run did not record taken from the
        registry as it is now (another run may have promoted its rows since this one started)."""
        seed = self._seed.read_bytes() if self._seed.exists() else None
        if staged.read_bytes() == seed:
            return  # this run recorded nothing new
        with cache.lock(self.root / STAGING / "claims"):
            now = final.read_bytes() if final.exists() else None
            if now == seed:
                replace_file(staged, final)
                return
            import pandas as pd
            new, old, cur = pd.read_parquet(staged), (pd.read_parquet(self._seed) if seed else None), \
                pd.read_parquet(final)
            mine = set(new.notebook)
            if old is not None:  # notebooks whose rows this run changed (normally just its own)
                mine = {nb for nb in set(new.notebook) | set(old.notebook)
                        if not new[new.notebook == nb].reset_index(drop=True).equals(
                            old[old.notebook == nb].reset_index(drop=True))}
            out = pd.concat([cur[~cur.notebook.isin(mine)], new[new.notebook.isin(mine)]], ignore_index=True)
            out = out.sort_values(["notebook"], kind="stable").reset_index(drop=True)
            cache.write_table(out[list(new.columns)], final)
