"""Packaging: `cancellation` is a regular package with a version, a light import, a wheel that
holds every module, and (installed outside a checkout) a cache in the user's cache directory."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import cancellation
from cancellation import cache

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lib" / "cancellation"


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()


def _modules(paths) -> set[str]:
    """'cancellation/x.py'-style names of the .py files among `paths` (relative, '/'-separated)."""
    return {p for p in paths if p.startswith("cancellation/") and p.endswith(".py") and "__pycache__" not in p}


def test_version_equals_pyprojects():
    try:
        import tomllib
        version = tomllib.loads(_pyproject())["project"]["version"]
    except ModuleNotFoundError:  # Python 3.10
        version = re.search(r'(?m)^version\s*=\s*"([^"]+)"', _pyproject()).group(1)
    assert cancellation.__version__ == version
    assert (PKG / "__init__.py").is_file() and cancellation.__doc__.strip()


def test_import_is_light_and_extras_are_declared():
    code = ("import sys, cancellation; heavy = sorted(m for m in ('torch', 'pandas', 'numpy', 'transformers', 'trl') "
            "if m in sys.modules); print(cancellation.__version__, heavy)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [cancellation.__version__, "[]"]
    assert 'tensorboard = ["tensorboard>=2.15"]' in _pyproject()


def test_relative_cache_dir_is_the_callers_and_is_shared_with_children(tmp_path):
    """CANCELLATION_CACHE=rel means <caller's cwd>/rel, also in processes started elsewhere (notebook kernels run
    with the repository as working directory)."""
    (tmp_path / "here").mkdir()
    child = "import cancellation.cache as c; print(c.DEFAULT_DIR)"
    code = textwrap.dedent(f"""
        import subprocess, sys, cancellation, cancellation.cache as c
        print(c.DEFAULT_DIR)
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c", {child!r}], cwd={str(ROOT)!r}, check=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "CANCELLATION_CACHE": "rel"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path / "here", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(tmp_path / "here" / "rel")] * 2


@pytest.mark.parametrize("env, want", [
    ({"CANCELLATION_CACHE": "/abs/c"}, "/abs/c"),
    ({"CANCELLATION_CACHE": "", "XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}, "/xdg/cancellation"),
    ({"XDG_CACHE_HOME": "relative/xdg", "HOME": "/home/u"}, "/home/u/.cache/cancellation"),  # XDG: relative is ignored
    ({"HOME": "/home/u"}, "/home/u/.cache/cancellation"),
])
def test_installed_package_caches_in_the_users_cache_directory(tmp_path, monkeypatch, env, want):
    site = tmp_path / "lib" / "python3.x" / "site-packages" / "cancellation" / "cache.py"
    site.parent.mkdir(parents=True)
    for k in ("CANCELLATION_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cache.source_root(site) is None
    assert cache.default_dir(os.environ, site) == Path(want)
    # in a source checkout the default stays <repo>/data/cache
    assert cache.source_root(PKG / "cache.py") == ROOT
    if not os.environ.get("CANCELLATION_CACHE"):
        assert cache.default_dir(os.environ, PKG / "cache.py") == ROOT / "data" / "cache"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the repository (pyproject.toml, README.md, lib/), so no build/ or
    *.egg-info is left in the tree; built with the running interpreter's setuptools (no network)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (needed to build the wheel without network)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    shutil.copytree(ROOT / "lib", src / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    leftovers = lambda: {p for p in [ROOT / "build", ROOT / "dist", *(ROOT / "lib").glob("*.egg-info")] if p.exists()}  # noqa: E731
    before = leftovers()
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert leftovers() == before  # no build/, dist/ or *.egg-info written into the repository
    (whl,) = (tmp / "dist").glob("cancellation-*.whl")
    return whl


def test_wheel_holds_every_module_and_its_metadata(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    want = _modules(p.relative_to(ROOT / "lib").as_posix() for p in PKG.rglob("*.py"))
    assert "cancellation/__init__.py" in want
    assert _modules(names) == want
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert f"Version: {cancellation.__version__}" in text
    assert "Provides-Extra: tensorboard" in text and 'tensorboard>=2.15; extra == "tensorboard"' in text


def test_installed_wheel_imports_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    installed = _modules(q.relative_to(target).as_posix() for q in (target / "cancellation").rglob("*.py"))
    assert installed == _modules(q.relative_to(ROOT / "lib").as_posix() for q in PKG.rglob("*.py"))
    code = textwrap.dedent("""
        import json, sys
        import cancellation, cancellation.cache
        from cancellation.engine import CancellationMonitor
        print(json.dumps({"file": cancellation.__file__, "version": cancellation.__version__,
                          "cache": str(cancellation.cache.DEFAULT_DIR), "monitor": CancellationMonitor.__name__,
                          "callback": [c.__name__ for c in CancellationMonitor.__mro__]}))
    """)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CANCELLATION_CACHE", "PYTHONPATH")}
    env.update(PYTHONPATH=str(target), XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=work, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).parent == target / "cancellation"  # the installed copy, not the checkout
    assert got["version"] == cancellation.__version__
    cache_dir = Path(got["cache"])
    assert cache_dir == tmp_path / "xdg" / "cancellation"
    assert not cache_dir.is_relative_to(target) and not cache_dir.is_relative_to(ROOT)
    assert got["monitor"] == "CancellationMonitor" and "TrainerCallback" in got["callback"]


# ------------------------------------------------------------------ the lock (requirements.lock, tools/lock.py)
def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock_entries() -> dict[str, tuple[str, int]]:
    """{name: (version, number of hashes)} read from requirements.lock line by line."""
    out, name = {}, None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if not line.startswith(" "):
            name, version = line.split(" ")[0].split("==")
            out[_canon(name)] = (version, 0)
        elif "--hash=sha256:" in line:
            v, n = out[_canon(name)]
            assert re.fullmatch(r"\s*--hash=sha256:[0-9a-f]{64}( \\)?", line), line
            out[_canon(name)] = (v, n + 1)
    return out


def _torch_spec() -> str:
    return re.search(r"(?m)^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text()).group(1)


def test_environment_yml_makefile_and_lock_name_the_same_versions():
    """environment.yml (conda) pins exactly the lock's packages at the lock's versions, torch at the Makefile's
    TORCH_SPEC (which the lock's header names too), every lock entry pinned with at least one hash."""
    import yaml
    lock = _lock_entries()
    assert len(lock) > 50 and all(n >= 1 for _, n in lock.values()), "a lock entry without a hash"
    pip = [d for d in yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"] if isinstance(d, dict)]
    pins = [p for p in pip[0]["pip"] if p != "-e ."]
    assert all("==" in p for p in pins), [p for p in pins if "==" not in p]
    env = {_canon(p.split("==")[0]): p.split("==")[1] for p in pins}
    assert env.pop("torch") == _torch_spec().split("==")[1]
    assert env == {k: v for k, (v, _) in lock.items()}
    assert f"TORCH_SPEC: {_torch_spec()}" in (ROOT / "requirements.lock").read_text()
    assert "torch" not in lock   # installed from TORCH_SPEC first (the CPU build), never through the lock


def test_locked_versions_lie_inside_pyprojects_ranges():
    """Every dependency pyproject declares (core and dev) is in the lock, at a version its range admits."""
    import tomllib

    from packaging.requirements import Requirement
    proj = tomllib.loads(_pyproject())["project"]
    lock = {k: v for k, (v, _) in _lock_entries().items()}
    lock["torch"] = _torch_spec().split("==")[1]
    for spec in proj["dependencies"] + proj["optional-dependencies"]["dev"]:
        r = Requirement(spec)
        assert _canon(r.name) in lock, f"{r.name} is not locked"
        assert r.specifier.contains(lock[_canon(r.name)], prereleases=True), (spec, lock[_canon(r.name)])
        for extra in r.extras:   # math-verify[antlr4_13_2]: the extra's own requirement is locked too
            assert extra != "antlr4_13_2" or lock.get("antlr4-python3-runtime") == "4.13.2"
