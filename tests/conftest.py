import atexit
import copy
import os
import shutil
import tempfile

# Hermetic tests: a fresh cache (and notebook 07's checkpoints under it) per test session, set before
# `cancellation` is imported (cache.DEFAULT_DIR reads it once); papermill kernels inherit it.
_CACHE = tempfile.mkdtemp(prefix="cancellation-test-cache-")
os.environ["CANCELLATION_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
# ... and its own signing key for pickled entries, outside the cache (never the user's ~/.config one)
_KEYDIR = tempfile.mkdtemp(prefix="cancellation-test-key-")
os.environ["CANCELLATION_CACHE_KEY"] = os.path.join(_KEYDIR, "cache.key")
atexit.register(shutil.rmtree, _KEYDIR, ignore_errors=True)

# `make test` runs two pytest-xdist workers, one file each at a time (`--dist loadfile`, so a module's fixtures
# and the cache entries its tests share stay in one process). Each worker is its own session above (its own
# cache and key); on a CPU it takes one thread, inherited by the notebook kernels it starts, so two workers
# fill two cores instead of four threads fighting over them. Alone (no xdist), torch's default threads.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"

# A clone with a borrowed venv (a symlinked .venv whose editable install points at another checkout) would
# silently test the other checkout's library: stop in one line naming both.
import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

_HERE = Path(__file__).resolve().parents[1] / "lib" / "cancellation"
_spec = importlib.util.find_spec("cancellation")
_THERE = Path(_spec.origin).resolve().parent if _spec and _spec.origin else None
if _THERE != _HERE:
    raise SystemExit(f"tests: `cancellation` imports from {_THERE}, not from this checkout's {_HERE} (a venv borrowed "
                     f"from another checkout?): run `make env` here, or `pip install --no-deps -e .` in this venv")

import pytest  # noqa: E402
import torch  # noqa: E402

from cancellation import cache, policy, rollout, sources, tasks, tiny  # noqa: E402

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify

assert cache.DEFAULT_DIR == __import__("pathlib").Path(_CACHE), "cancellation was imported before conftest"


@pytest.fixture(scope="session")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(scope="session")
def model64():
    """A randomly initialised small Qwen2 in float64 (fast; tests do not need a trained policy)."""
    m = policy.exact_norms(tiny.build_tiny_model("tiny-s", seed=0).to(torch.float64))
    m.eval()
    return m


@pytest.fixture(scope="session")
def canonical_standins():
    """data/standins/ as the paper-smoke and paper-vocab profiles name it, paper-vocab model included
    (idempotent: a no-op once built), so no test depends on another having built it first. Its paths."""
    from cancellation import profiles, standins
    return standins.build(profiles.ROOT / "data" / "standins")


@pytest.fixture(scope="session")
def standin_model():
    """data/standins/model's path, which the sampler's tests and two GPU tests load: found, or built with the
    canonical stand-ins when missing (a fresh clone, a bare GPU machine where gpu-check's standins step did not
    run), never assumed."""
    from cancellation import profiles, standins
    path = profiles.ROOT / "data" / "standins" / "model"
    if not (path / "config.json").exists():
        standins.build(profiles.ROOT / "data" / "standins")
    return str(path)


@pytest.fixture
def fake_vllm(monkeypatch):
    """tests/fake_vllm/vllm as `vllm` (records every call, samples with the real HF model, models vLLM's prefix
    cache); the real one, if any, is put back after."""
    import sys
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fake_vllm"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "vllm" or k.startswith("vllm.")}
    import vllm
    assert vllm.__version__ == "0.0-fake"
    yield vllm
    for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[k]
    sys.modules.update(saved)


@pytest.fixture
def saved_model(tmp_path, tok, model64):
    """A peaked random tiny model (float64) with two stop ids (<eos> and '.'), saved where vllm.LLM can load it."""
    m = copy.deepcopy(model64)
    m.generation_config.eos_token_id = [tok.eos_token_id, tasks.VOCAB.index(".")]
    with torch.no_grad():
        m.lm_head.weight.mul_(25.0)
    m.save_pretrained(tmp_path)
    tiny.save_tokenizer(tok, tmp_path)
    return m, tmp_path


@pytest.fixture
def fresh(model64):
    return copy.deepcopy(model64)


@pytest.fixture(scope="session")
def batch(model64, tok):
    """A real sampled batch with hand-set mixed rewards (a random model never solves the task)."""
    b = rollout.sample(model64, tok, rollout.SampleConfig(n_prompts=3, G=4, max_new_tokens=24, source=RAW),
                       problems=tasks.sample_problems(3, seed=1), seed=0)
    b.reward = torch.tensor([1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    return b


@pytest.fixture(scope="module")
def tiny_m():
    """The trained tiny policy in float64, one per test module (test_trials, test_pack)."""
    return policy.load_policy("data/policies/tiny-m", dtype="float64")


@pytest.fixture(scope="module")
def real_batch(tiny_m):
    """A batch sampled from the trained tiny policy (3 x 4 rollouts, 40 new tokens), with mixed rewards set by
    hand in every group, so every update moves something (test_trials, test_pack)."""
    model, tok = tiny_m
    b = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=3, G=4, max_new_tokens=40, source=RAW),
                       problems=tasks.sample_problems(3, seed=2), seed=3)
    b.reward = torch.tensor([1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 0], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    return b


# The files that run notebooks or launch processes, longest first (a fresh-clone run on 2 cores, 2026-11-28):
# `make test`'s workers take whole files in collection order, so these start first and the short files fill
# in at the end, instead of a 7-minute file starting last while the other worker idles. The second file needs no
# stand-ins: the first worker builds them (about 90 s, under a lock), and a second paper-vocab file there would
# have its worker wait that long.
LONG_FIRST = ("test_paper_vocab_late.py", "test_procs.py", "test_paper_vocab.py", "test_notebooks.py",
              "test_paper_smoke.py", "test_plan.py", "test_golden.py", "test_grader_answers.py",
              "test_grader_modes.py", "test_plan_tally.py", "test_engine.py", "test_checkpoints.py")


def pytest_collection_modifyitems(config, items):
    """The LONG_FIRST files first (the rest in their order); skip tests marked `gpu` when no CUDA device is
    present (CI and the tiny profile)."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))   # stable: order within a file kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    """Which installed packages differ from requirements.lock (`make env` installs the lock; a venv of your own or
    `make env-latest` may not): tight checks were set on the locked versions."""
    import re
    from importlib import metadata
    lock = Path(__file__).resolve().parents[1] / "requirements.lock"
    moved = []
    for m in re.finditer(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text() if lock.exists() else ""):
        try:
            have = metadata.version(m.group(1))
        except metadata.PackageNotFoundError:
            have = "absent"
        if have != m.group(2):
            moved.append(f"{m.group(1)} {have} (locked {m.group(2)})")
    return (f"not the lock: {', '.join(moved[:8])}{' ...' if len(moved) > 8 else ''}" if moved
            else "packages: requirements.lock's versions")
