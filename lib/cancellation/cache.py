"""Content-addressed cache of expensive results, with atomic writes and per-key locks.

A key is the hash of the stage name, its parameters (JSON) and a code version string, so a
changed parameter recomputes and a rerun with the same parameters is instant. Callers put the
*content* of their inputs in the parameters (policy.fingerprint, ProblemSource.params()), never
a path alone. Values are written to a temporary file and renamed, so an interrupted run never
leaves a partial entry; a per-key file lock makes a second run of the same computation wait for
the first and then read its entry; an unreadable entry is moved aside (`.corrupt`), reported and
recomputed. Files are created with the usual permissions (0644 under umask 022), not mkstemp's 0600.

The cache lives in $CANCELLATION_CACHE when set (the tests set it to a temporary directory; a
relative path is taken against the working directory of the process that first imports the
package, which also writes the absolute path back to the environment so that notebook kernels
and workers started from another directory share it), else in data/cache/ of the repository in a
source checkout, else (an installed package) in the user's cache directory,
$XDG_CACHE_HOME/cancellation or ~/.cache/cancellation -- never inside site-packages.

Pickled entries cannot run code someone else planted: each is written as a header, an
HMAC-SHA256 (of the entry's key and the pickle) and the pickle, the HMAC under a per-user secret
kept outside the cache ($CANCELLATION_CACHE_KEY, else $XDG_CONFIG_HOME/cancellation/cache.key or
~/.config/cancellation/cache.key, created with mode 0600 on first use). The HMAC is checked
before anything is unpickled; an entry that fails (tampered with, planted, copied from another
key, written by another user or before entries were signed) is moved aside with one warning and
recomputed. A shared cache directory thus needs no trust in its other writers; the key file
must never be shared. Tables (DataFrames) are parquet, which holds data, not code, but a planted
or edited table would be read as a result: they are signed the same way (header, HMAC of the key and
the parquet bytes, the parquet bytes, in `<key>.parquet`), so the cache's numbers, too, are only ever
the ones this user computed. Entries written before tables were signed are moved aside and
recomputed; `python -m cancellation.cache sign-tables [DIR]` signs the unsigned tables of a cache
only you have written instead (a one-time migration; never run it on a shared cache).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import hmac
import io
import json
import os
import pickle
import secrets
import tempfile
import warnings
from pathlib import Path

import pandas as pd



def source_root(package_file: str | Path = __file__) -> Path | None:
    """The repository root when the package runs from a source checkout (pyproject.toml and
    notebooks/ two levels above the package directory), else None (an installed package)."""
    root = Path(package_file).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def default_dir(environ=os.environ, package_file: str | Path = __file__) -> Path:
    """Where the cache lives: $CANCELLATION_CACHE (made absolute against the working directory),
    else <checkout>/data/cache, else $XDG_CACHE_HOME/cancellation or ~/.cache/cancellation."""
    if environ.get("CANCELLATION_CACHE"):
        return Path(os.path.abspath(os.path.expanduser(environ["CANCELLATION_CACHE"])))
    root = source_root(package_file)
    if root is not None:
        return root / "data" / "cache"
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".cache"  # XDG: relative is invalid
    return base / "cancellation"


DEFAULT_DIR = default_dir()


def dir_problem(d: str | Path | None = None, environ=os.environ) -> str | None:
    """Why the cache folder cannot be used, in one line naming where it came from, or None: the folder
    (or a folder above it) exists as a file. The runner checks this before any notebook starts."""
    d = Path(d or DEFAULT_DIR)
    for p in (d, *d.parents):
        if p.exists():
            if p.is_dir():
                return None
            src = (f"CANCELLATION_CACHE={environ['CANCELLATION_CACHE']}" if environ.get("CANCELLATION_CACHE")
                   else f"the cache folder {d}")
            return (f"{src}: {p} is a file, not a folder; point CANCELLATION_CACHE at a folder (it is created "
                    "when missing) or remove the file")
    return None
CODE_VERSION = "4"  # 4: clipfrac counts only binding clips (verl pg_clipfrac); 3: rewards on responses without special tokens; 2: float64 RMSNorm in float64 models  # bump when a cached computation changes meaning


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file; mkstemp gives 0600


class CacheWarning(UserWarning):
    """An unreadable cache entry or checkpoint was moved aside and will be recomputed."""


class CacheKeyError(RuntimeError):
    """The per-user secret that signs cache entries is unusable (readable by others, not ours, too short)."""


def key_file(environ=os.environ) -> Path:
    """Where the secret that signs pickled cache entries lives: $CANCELLATION_CACHE_KEY, else
    $XDG_CONFIG_HOME/cancellation/cache.key or ~/.config/cancellation/cache.key (never the cache)."""
    if environ.get("CANCELLATION_CACHE_KEY"):
        return Path(os.path.abspath(os.path.expanduser(environ["CANCELLATION_CACHE_KEY"])))
    xdg = environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".config"
    return base / "cancellation" / "cache.key"


_SECRETS: dict[Path, bytes] = {}


def secret(path: str | Path | None = None) -> bytes:
    """The per-user signing secret at `path` (default key_file()), created (32 random bytes, hex,
    mode 0600, atomically: two first runs get the same key) when missing."""
    p = Path(path) if path else key_file()
    if p in _SECRETS:
        return _SECRETS[p]
    if not p.exists():
        try:
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")  # mode 0600
        except OSError as e:
            raise CacheKeyError(f"{p}: cannot create the cache signing key ({e.strerror or e}); set "
                                f"CANCELLATION_CACHE_KEY to a path of a private file you can write") from None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(tmp, p)  # fails when another process created it first: use theirs
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    st = os.stat(p)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise CacheKeyError(f"{p}: the cache signing key must be yours and private (mode 0600, owner uid "
                            f"{os.geteuid()}); it is mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}. "
                            f"Remove it (a new one is made; cached pickles are then recomputed) or chmod 600 it")
    data = p.read_bytes().strip()
    if len(data) < 32:
        raise CacheKeyError(f"{p}: the cache signing key is {len(data)} bytes; expected 64 hex digits "
                            f"(remove it and a new one is made)")
    _SECRETS[p] = data
    return data


SIGNED = b"cancellation-cache pickle hmac-sha256 v1\n"
SIGNED_TABLE = b"cancellation-cache parquet hmac-sha256 v1\n"


class Untrusted(ValueError):
    """A pickled entry without a valid signature under this user's key: never unpickled."""


def _mac(k: str, payload: bytes) -> bytes:
    return hmac.new(secret(), k.encode() + b"\0" + payload, hashlib.sha256).digest()


def sign(k: str, payload: bytes, header: bytes = SIGNED) -> bytes:
    """The bytes of a signed entry for cache key `k`: header, HMAC-SHA256(key name + payload), payload.
    A table (header SIGNED_TABLE) is signed under `k` + '.parquet', so no pickle's signature fits it."""
    return header + _mac(_signed_name(k, header), payload) + payload


def _signed_name(k: str, header: bytes) -> str:
    return k + ".parquet" if header == SIGNED_TABLE else k


def verified(k: str, data: bytes, header: bytes = SIGNED) -> bytes:
    """The payload inside a signed entry of key `k`; Untrusted when the signature does not hold."""
    what = "not read" if header == SIGNED_TABLE else "not unpickled"
    n = len(header) + 32
    if not data.startswith(header) or len(data) < n:
        raise Untrusted(f"not signed: planted, or written before entries were signed; {what}")
    if not hmac.compare_digest(data[len(header):n], _mac(_signed_name(k, header), data[n:])):
        raise Untrusted("signature does not match this user's key: tampered with, copied from another entry, "
                        f"or written by another user; {what}")
    return data[n:]


def key(stage: str, params: dict, version: str = CODE_VERSION) -> str:
    blob = json.dumps({"stage": stage, "params": params, "version": version}, sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def atomic_write(path: str | Path, write):
    """`write(tmp_path)` to a unique temporary file beside `path`, then rename it onto `path`.

    Readers see the old file or the new one, never a partial one; two writers never share a
    temporary file. The result has the mode a plain open() would give it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def lock(path: str | Path):
    """An exclusive advisory lock (fcntl.flock) on `path`.lock, held for the `with` block.

    A second process asking for the same lock waits. Lock files are left in place (removing one
    while another process waits on it would let a third take a different lock).
    """
    lp = Path(f"{path}.lock")
    lp.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lp, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def move_aside(path: str | Path, why: str) -> Path:
    """Rename an unreadable file to `<path>.corrupt` (kept for inspection) and warn, naming it."""
    path = Path(path)
    dest = Path(f"{path}.corrupt")
    os.replace(path, dest)
    warnings.warn(f"{path}: unreadable ({why}); moved to {dest.name}, recomputing", CacheWarning, stacklevel=3)
    return dest


MISS = object()


def _read(path: Path, k: str):
    if path.suffix == ".parquet":   # the HMAC before the table is read
        return pd.read_parquet(io.BytesIO(verified(k, path.read_bytes(), SIGNED_TABLE)))
    return pickle.loads(verified(k, path.read_bytes()))  # the HMAC before any byte is unpickled


def load(stage: str, params: dict, cache_dir: str | Path | None = None, version: str = CODE_VERSION):
    """The cached value of (stage, params, version), or MISS; an unreadable entry is moved aside (a miss)."""
    d = Path(cache_dir or DEFAULT_DIR)
    k = key(stage, params, version)
    for path in (d / f"{k}.parquet", d / f"{k}.pkl"):
        if path.exists():
            try:
                return _read(path, k)
            except FileNotFoundError:  # replaced between exists() and open(): read again below
                continue
            except Untrusted as e:
                move_aside(path, str(e))
            except Exception as e:  # truncated/garbled: pickle, pyarrow and EOF errors differ
                move_aside(path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
    return MISS


def _store(d: Path, k: str, value):
    if isinstance(value, pd.DataFrame):
        buf = io.BytesIO()
        value.to_parquet(buf, index=False)
        data, path = sign(k, buf.getvalue(), SIGNED_TABLE), d / f"{k}.parquet"
    else:
        data, path = sign(k, pickle.dumps(value)), d / f"{k}.pkl"

    def w(t):
        with open(t, "wb") as f:
            f.write(data)
    atomic_write(path, w)


def cached(stage: str, params: dict, compute, cache_dir: str | Path | None = None, version: str = CODE_VERSION):
    """Return compute() cached under (stage, params, version); DataFrames as parquet, else pickle.

    Runs of the same key at once: the first computes under the key's lock, the others wait and
    read its entry.
    """
    d = Path(cache_dir or DEFAULT_DIR)
    value = load(stage, params, d, version)
    if value is not MISS:
        return value
    k = key(stage, params, version)
    with lock(d / ".locks" / k):
        value = load(stage, params, d, version)  # another run may have written it while we waited
        if value is not MISS:
            return value
        if compute is None:
            raise KeyError(f"no cache entry {d / k}.* and nothing to compute it with")
        value = compute()
        _store(d, k, value)
    return value


def write_table(df: pd.DataFrame, path: str | Path):
    """Atomically write a result table (.parquet or .csv)."""
    path = Path(path)
    if path.suffix == ".csv":
        atomic_write(path, lambda t: df.to_csv(t, index=False))
    else:
        atomic_write(path, lambda t: df.to_parquet(t, index=False))


def read_table(path: str | Path) -> pd.DataFrame:
    """A result table as `write_table` wrote it (.parquet or .csv)."""
    path = Path(path)
    return pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)


def sign_tables(cache_dir: str | Path | None = None) -> tuple[int, int]:
    """Sign, in place, the unsigned table entries (`<key>.parquet` written before tables were signed)
    of a cache only this user has written: (signed, skipped: not this user's file or not a parquet
    table). A one-time migration that trusts those files as they are: never on a shared cache."""
    d = Path(cache_dir or DEFAULT_DIR)
    signed = skipped = 0
    for path in sorted(d.glob("*.parquet")):
        k = path.name[:-len(".parquet")]
        with lock(d / ".locks" / k):
            try:
                data = path.read_bytes()
                if data.startswith(SIGNED_TABLE):
                    continue
                if path.stat().st_uid != os.geteuid():
                    skipped += 1
                    continue
                pd.read_parquet(io.BytesIO(data))   # a table, not garbage
            except Exception:  # noqa: BLE001 - pyarrow's errors vary; such an entry is just not signed
                skipped += 1
                continue
            signed_bytes = sign(k, data, SIGNED_TABLE)

            def w(t, b=signed_bytes):
                with open(t, "wb") as f:
                    f.write(b)
            atomic_write(path, w)
            signed += 1
    return signed, skipped


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m cancellation.cache", description="Cache maintenance.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("sign-tables", help="sign the unsigned table entries of a cache only you have written "
                                           "(written before tables were signed), instead of recomputing them")
    st.add_argument("dir", nargs="?", default=None, help=f"the cache folder (default {DEFAULT_DIR})")
    a = ap.parse_args(argv)
    n, skipped = sign_tables(a.dir)
    print(f"signed {n} unsigned table entries in {Path(a.dir or DEFAULT_DIR)}"
          + (f"; left {skipped} unsigned (not your file, or not a parquet table): they are recomputed when next used"
             if skipped else ""))


if __name__ == "__main__":
    main()
