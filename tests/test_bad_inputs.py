"""Issue 35, bad inputs: what a hostile-but-fair user (or a co-user of a shared cache) does.

| case                                                  | behaviour now                                                |
|-------------------------------------------------------|--------------------------------------------------------------|
| planted / tampered pickle in the cache                | never unpickled (HMAC under a per-user key); moved aside, one warning, recomputed |
| planted object in a training checkpoint               | torch.load(weights_only=True) + allow-list: not executed; moved aside, run restarts |
"""
import os
import pickle
import stat
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from cancellation import cache, train


class _Payload:
    """A pickle that creates `marker` when it is unpickled (what an attacker would plant)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# ------------------------------------------------------------------ SECURITY: cache entries and checkpoints
def test_signing_key_is_private_outside_the_cache_and_made_once(tmp_path):
    assert not cache.key_file().is_relative_to(cache.DEFAULT_DIR)  # the tests' own key, not in the cache
    p = tmp_path / "cfg" / "cancellation" / "cache.key"
    assert cache.key_file({"XDG_CONFIG_HOME": str(tmp_path / "cfg")}) == p
    assert cache.key_file({"HOME": "/h"}).name == "cache.key"
    k = cache.secret(p)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600 and len(k) == 64
    cache._SECRETS.clear()
    assert cache.secret(p) == k  # read back, not replaced
    os.chmod(p, 0o644)
    cache._SECRETS.clear()
    with pytest.raises(cache.CacheKeyError, match=r"cache.key: the cache signing key must be yours and private"):
        cache.secret(p)


@pytest.mark.parametrize("how", ["planted", "tampered", "copied"])
def test_planted_pickle_in_the_cache_is_never_executed_and_is_recomputed(tmp_path, how):
    marker = tmp_path / "pwned"
    d = tmp_path / "cache"
    k = cache.key("stage", {"x": 1})
    evil = pickle.dumps(_Payload(marker))
    if how == "planted":      # a raw pickle, as any writer of a shared cache could drop in
        data = evil
    elif how == "tampered":   # a genuine entry whose pickle was swapped, the signature kept
        cache.cached("stage", {"x": 1}, lambda: {"v": 0}, d)
        data = (d / f"{k}.pkl").read_bytes()[:len(cache.SIGNED) + 32] + evil
    else:                     # a genuine signed entry of another key, copied over this one
        cache.cached("stage", {"x": 2}, lambda: {"v": 2}, d)
        data = (d / f"{cache.key('stage', {'x': 2})}.pkl").read_bytes()
    d.mkdir(exist_ok=True)
    (d / f"{k}.pkl").write_bytes(data)
    with pytest.warns(cache.CacheWarning) as w:
        got = cache.cached("stage", {"x": 1}, lambda: {"v": 1}, d)
    msgs = [str(x.message) for x in w if issubclass(x.category, cache.CacheWarning)]
    assert len(msgs) == 1 and len(msgs[0].splitlines()) == 1, msgs
    assert f"{k}.pkl: unreadable (" in msgs[0] and "not unpickled" in msgs[0] and "recomputing" in msgs[0]
    assert not marker.exists() and got == {"v": 1}
    assert (d / f"{k}.pkl.corrupt").read_bytes() == data  # kept for inspection, never loaded again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.cached("stage", {"x": 1}, lambda: 1 / 0, d) == {"v": 1}  # the recomputed entry is served
    assert not marker.exists()


def test_entries_signed_under_another_users_key_are_recomputed(tmp_path, monkeypatch):
    d = tmp_path / "shared"
    cache.cached("s", {"a": 1}, lambda: [1, 2], d)
    monkeypatch.setenv("CANCELLATION_CACHE_KEY", str(tmp_path / "other" / "cache.key"))  # another user
    with pytest.warns(cache.CacheWarning, match="does not match this user's key"):
        assert cache.cached("s", {"a": 1}, lambda: [3], d) == [3]
    assert cache.cached("s", {"a": 1}, lambda: 1 / 0, d) == [3]
    assert cache.cached("s", {"b": 1}, lambda: pd.DataFrame({"a": [1]}), d).a.tolist() == [1]  # tables: parquet


def test_planted_object_in_a_checkpoint_is_not_executed_and_the_run_restarts(tmp_path):
    marker = tmp_path / "pwned"
    ck = tmp_path / "run.pt"
    torch.save({"config": 1, "model": {}, "optimizer": {}, "torch_rng": torch.get_rng_state(),
                "state": {"x": _Payload(marker)}}, ck)
    with pytest.warns(cache.CacheWarning, match=r"run.pt: unreadable \(holds objects outside the checkpoint "
                                                r"allow-list, not executed") as w:
        assert train._load_checkpoint(ck) is None
    assert len(str(w[0].message).splitlines()) == 1
    assert not marker.exists() and (tmp_path / "run.pt.corrupt").exists() and not ck.exists()


def test_checkpoint_with_the_rb_buffer_loads_weights_only(tmp_path):
    from cancellation import batching, rollout, tasks
    b = rollout.RolloutBatch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                             torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]),
                             torch.tensor([1.0, -1.0]), problems=[tasks.Problem("1+1?", "2")], texts=["a", "b"])
    buf = batching.RewardBalancedBuffer(4)
    buf.add(b, 0)
    ck = tmp_path / "run.pt"
    train._save(ck, {"config": {"seed": 1}, "model": {"w": torch.ones(2)}, "optimizer": {}, "torch_rng":
                     torch.get_rng_state(), "state": {"buffer": buf, "iters": [{"a": 1.0, "u": True}]}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = train._load_checkpoint(ck)
    assert got["state"]["buffer"].rows.problems == [tasks.Problem("1+1?", "2")] and got["state"]["buffer"].sampled == 2
