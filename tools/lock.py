"""The lock: every package `make env` installs, pinned and hashed, and environment.yml made from it.

    python tools/lock.py write PYTHON   requirements.lock from PYTHON's `pip freeze` (a venv that passed the
                                        suite), hashes from the package index; then environment.yml from the lock
    python tools/lock.py diff PYTHON    which packages PYTHON's venv has at other versions than the lock
    python tools/lock.py env            environment.yml from requirements.lock (no network)

Why a freeze and not a resolver: the lock must be the versions a tested venv actually held (`make env-latest`
builds one from pyproject's ranges and runs the suite in it; `make lock` then writes its freeze here), not a
second resolution that could pick others. torch is not in the lock: `make env` installs TORCH_SPEC first (the
CPU build, from a local file on the developers' machines, whose hash is not PyPI's) and the lock's packages
after it with --no-deps, so nothing here pulls another torch. Only the standard library: it runs before any
venv exists.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
ENV_YML = ROOT / "environment.yml"
INDEX = "https://pypi.org/simple"
NOT_LOCKED = {"torch"}          # installed from TORCH_SPEC before the lock (see the docstring)
HEADER = """\
# The lock: every package `make env` installs besides torch, pinned to the versions that passed the test suite
# and reproduce the committed tables, with the index's hashes (pip install --require-hashes --no-deps).
# Written by `make lock` (tools/lock.py) from the freeze of a tested venv; do not edit by hand.
# Resolved on Linux x86_64, CPython 3.11. torch comes first, from the Makefile's TORCH_SPEC: {torch}
# pyproject.toml keeps ranges for installing the library into your own stack; `make env-latest` tries the newest.
"""


def canonical(name: str) -> str:
    """PEP 503's normalised name (what the index's URLs and a freeze's comparisons use)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze(python: str) -> dict[str, str]:
    """{name: version} of what `python`'s environment holds (editable installs left out)."""
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                         check=True).stdout
    pins = {}
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" not in line:
            raise SystemExit(f"tools/lock.py: {python} holds {line!r}, not a released version from the index: "
                             "a lock can only name index releases (install it from the index, then lock again)")
        name, version = line.split("==", 1)
        pins[name] = version
    return pins


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{name: version} of the lock (hash lines and comments skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", line)
        if m:
            pins[m.group(1)] = m.group(2)
    return pins


def lock_torch(path: Path = LOCK) -> str:
    """The torch requirement the lock's header names (TORCH_SPEC when it was written)."""
    m = re.search(r"TORCH_SPEC: (\S+)", path.read_text())
    if not m:
        raise SystemExit(f"{path}: no 'TORCH_SPEC: torch==...' in its header")
    return m.group(1)


def _filename_version(filename: str, name: str) -> str | None:
    """The version in a wheel's or sdist's file name of project `name` (None when it is not one of name's)."""
    stem = canonical(name).replace("-", "_")
    base = filename
    for ext in (".whl", ".tar.gz", ".zip", ".tar.bz2"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    else:
        return None
    parts = base.split("-")
    # wheel: name-version(-build)?-py-abi-plat; sdist: name-version (the name's own '-' are '_' in wheels, maybe
    # not in old sdists: match the longest prefix that normalises to the name)
    for i in range(1, len(parts)):
        if canonical("-".join(parts[:i])).replace("-", "_") == stem:
            return parts[i] if i < len(parts) else None
    return None


def hashes(name: str, version: str, index: str = INDEX) -> list[str]:
    """sha256 of every file of `name` `version` on the index (PEP 691 JSON), sorted: pip accepts any one."""
    req = urllib.request.Request(f"{index}/{canonical(name)}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    want = version.split("+")[0]
    out = sorted({f["hashes"]["sha256"] for f in files
                  if "sha256" in f.get("hashes", {}) and _filename_version(f["filename"], name) == want})
    if not out:
        raise SystemExit(f"tools/lock.py: {index} has no file of {name}=={version} (a local build cannot be locked)")
    return out


def torch_spec() -> str:
    """The Makefile's TORCH_SPEC default."""
    m = re.search(r"(?m)^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text())
    return m.group(1)


def write_lock(python: str, path: Path = LOCK) -> dict[str, str]:
    pins = {n: v for n, v in freeze(python).items() if canonical(n) not in NOT_LOCKED}
    lines = [HEADER.format(torch=torch_spec())]
    for i, (name, version) in enumerate(sorted(pins.items(), key=lambda kv: canonical(kv[0]))):
        if sys.stderr.isatty():
            print(f"\r  hashes {i + 1}/{len(pins)}: {name:<40}", end="", file=sys.stderr, flush=True)
        hs = hashes(name, version)
        lines.append(f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hs) + "\n")
    print(file=sys.stderr)
    path.write_text("".join(lines))
    return pins


def environment_yml(pins: dict[str, str], torch: str) -> str:
    """environment.yml for conda users: the lock's pins (no hashes: conda's pip section takes none)."""
    deps = "\n".join(f"      - {n}=={v}" for n, v in sorted(pins.items(), key=lambda kv: canonical(kv[0])))
    return f"""\
# conda env create -f environment.yml && conda activate cancellation
# Generated from requirements.lock by `make lock` (tools/lock.py): the same pins as `make env`, without hashes.
# CPU environment (tiny profile). For the GPU `paper` profile uncomment the lines at the end.
name: cancellation
channels:
  - conda-forge
dependencies:
  - python=3.11
  - pip
  - pip:
      - {torch}
{deps}
      - -e .
      # GPU (paper profile):
      # - vllm>=0.10
      # - deepspeed>=0.16     # configs/accelerate_zero{{2,3}}.yaml (4B/7B across GPUs)
"""


def diff(python: str) -> list[tuple[str, str | None, str | None]]:
    """(name, locked version, venv version) of every package where they differ (None: absent)."""
    lock = {canonical(n): (n, v) for n, v in read_lock().items()}
    have = {canonical(n): (n, v) for n, v in freeze(python).items() if canonical(n) not in NOT_LOCKED}
    out = []
    for k in sorted(set(lock) | set(have)):
        a, b = lock.get(k, (None, None)), have.get(k, (None, None))
        if a[1] != b[1]:
            out.append((a[0] or b[0], a[1], b[1]))
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("write", "diff", "env") or (argv[0] != "env" and len(argv) != 2):
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        return 2
    if argv[0] == "write":
        pins = write_lock(argv[1])
        ENV_YML.write_text(environment_yml(pins, torch_spec()))
        print(f"{LOCK.name}: {len(pins)} packages; {ENV_YML.name} regenerated")
    elif argv[0] == "env":
        ENV_YML.write_text(environment_yml(read_lock(), lock_torch()))
        print(f"{ENV_YML.name} regenerated from {LOCK.name}")
    else:
        moved = diff(argv[1])
        if not moved:
            print(f"{argv[1]}: every package at the locked version")
        else:
            print(f"{len(moved)} package{'s' * (len(moved) != 1)} differ{'s' * (len(moved) == 1)} from {LOCK.name} "
                  "(locked -> this venv):")
            for name, a, b in moved:
                print(f"  {name:<32} {a or '(not locked)':>16} -> {b or '(absent)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
