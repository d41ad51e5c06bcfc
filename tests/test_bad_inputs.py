"""Issue 35, bad inputs: what a hostile-but-fair user (or a co-user of a shared cache) does.

| case                                                  | behaviour now                                                |
|-------------------------------------------------------|--------------------------------------------------------------|
| planted / tampered pickle in the cache                | never unpickled (HMAC under a per-user key); moved aside, one warning, recomputed |
| planted object in a training checkpoint               | torch.load(weights_only=True) + allow-list: not executed; moved aside, run restarts |
| promotion fails part way (full disk, read-only dir)   | destinations checked before the first move; what moved is put back; one line, rc 1 |
| monitor: resumed run / a user's part-*.parquet        | earlier parts kept up to the checkpoint; only its own parts (manifest) are touched |
| profile: syntax error, !!python tag, latin-1, int key | one line naming file and line, exit 2, no traceback          |
| profile: duplicate section or key                     | error naming file, line and the first occurrence             |
| profile: nested aliases ("billion laughs")            | refused above 100,000 values; every error line truncated     |
| seed 10**23, lr 1e300                                 | refused at --check naming the value                          |
"""
import dataclasses
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
    (tmp_path / "file").write_text("")
    with pytest.raises(cache.CacheKeyError, match=r"cannot create the cache signing key .* set CANCELLATION_CACHE_KEY"):
        cache.secret(tmp_path / "file" / "cache.key")


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


@pytest.mark.parametrize("how", ["planted", "edited", "copied", "pickle-signature"])
def test_planted_or_edited_table_in_the_cache_is_never_read_and_is_recomputed(tmp_path, how):
    """Tables carry no code, but a planted or edited one would be served as a result: they are signed too."""
    d = tmp_path / "shared"
    true = pd.DataFrame({"delta": [0.25, -0.5]})
    k = cache.key("stage", {"x": 1})
    cache.cached("stage", {"x": 1}, lambda: true, d)
    genuine = (d / f"{k}.parquet").read_bytes()
    assert genuine.startswith(cache.SIGNED_TABLE)
    assert cache.cached("stage", {"x": 1}, lambda: 1 / 0, d).equals(true)     # served from the signed entry
    fake = pd.DataFrame({"delta": [9.0, 9.0]})
    if how == "planted":       # a plain parquet file, as any writer of a shared cache could drop in
        fake.to_parquet(d / f"{k}.parquet", index=False)
    elif how == "edited":      # the genuine entry's table swapped, its signature kept
        import io
        buf = io.BytesIO()
        fake.to_parquet(buf, index=False)
        (d / f"{k}.parquet").write_bytes(genuine[:len(cache.SIGNED_TABLE) + 32] + buf.getvalue())
    elif how == "copied":      # a genuine signed table of another key
        cache.cached("stage", {"x": 2}, lambda: fake, d)
        (d / f"{k}.parquet").write_bytes((d / f"{cache.key('stage', {'x': 2})}.parquet").read_bytes())
    else:                      # a pickle entry's valid signature on a table (same key, other kind)
        import io
        buf = io.BytesIO()
        fake.to_parquet(buf, index=False)
        signed = cache.sign(k, buf.getvalue())
        (d / f"{k}.parquet").write_bytes(cache.SIGNED_TABLE + signed[len(cache.SIGNED):])
    planted = (d / f"{k}.parquet").read_bytes()
    with pytest.warns(cache.CacheWarning) as w:
        got = cache.cached("stage", {"x": 1}, lambda: true, d)
    msgs = [str(x.message) for x in w if issubclass(x.category, cache.CacheWarning)]
    assert len(msgs) == 1 and f"{k}.parquet: unreadable (" in msgs[0] and "not read" in msgs[0], msgs
    assert got.equals(true) and (d / f"{k}.parquet.corrupt").read_bytes() == planted


def test_sign_tables_migrates_a_private_cache_once(tmp_path, capsys):
    """Unsigned tables written before tables were signed: `python -m cancellation.cache sign-tables DIR`
    signs the user's own (no recompute); garbage stays unsigned; a signed entry is not signed twice."""
    d = tmp_path / "mine"
    d.mkdir()
    old = pd.DataFrame({"v": [1.5, 2.5]})
    k = cache.key("stage", {"x": 1})
    old.to_parquet(d / f"{k}.parquet", index=False)                         # as the cache wrote them before
    (d / f"{cache.key('stage', {'x': 2})}.parquet").write_bytes(b"PAR1 not a table")
    cache.main(["sign-tables", str(d)])
    assert capsys.readouterr().out.strip() == (f"signed 1 unsigned table entries in {d}; left 1 unsigned (not your "
                                               "file, or not a parquet table): they are recomputed when next used")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.cached("stage", {"x": 1}, lambda: 1 / 0, d).equals(old)   # read, not recomputed
    assert cache.sign_tables(d) == (0, 1)


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


# ------------------------------------------------------------------ DATA-LOSS: promotion is all or nothing
def _stage(tmp_path):
    """A Stage whose final directories hold an earlier run's outputs, with a new run's files staged."""
    from cancellation import staging
    root = tmp_path / "repo"
    final = {"fig_dir": root / "figures/tiny", "results_dir": root / "data/results/tiny",
             "executed_dir": root / "notebooks/executed/tiny"}
    for k, name in (("fig_dir", "f.txt"), ("results_dir", "t.csv"), ("executed_dir", "97.ipynb")):
        final[k].mkdir(parents=True)
        (final[k] / name).write_text("old")
    st = staging.Staging(root, "97", final)
    for k, names in (("fig_dir", ["f.txt", "g.txt"]), ("results_dir", ["t.csv"]), ("executed_dir", ["97.ipynb"])):
        for n in names:
            (st.dirs[k] / n).write_text("new")
    return root, st


def _outputs(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".run-staging" not in p.parts}


def test_promotion_failing_part_way_puts_back_what_moved(tmp_path, monkeypatch):
    from cancellation import staging
    root, st = _stage(tmp_path)
    before = _outputs(root)
    real = staging.replace_file

    def fail_on_tables(src, dst):  # a full disk / read-only directory met at the second destination
        if "results" in dst.parts:
            raise OSError(28, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(staging, "replace_file", fail_on_tables)
    with st, pytest.raises(staging.PromotionError) as e:
        st.promote()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "t.csv: No space left on device" in msg and "was put back" in msg, msg
    assert _outputs(root) == before  # figures moved first are the old ones again; g.txt is gone
    assert not [p for p in root.rglob("*.bak")]
    monkeypatch.setattr(staging, "replace_file", real)
    root2, st2 = _stage(tmp_path / "b")
    with st2:
        st2.promote()  # the usual case: all new, no backups left behind
    assert {k: v for k, v in _outputs(root2).items()} == {
        "figures/tiny/f.txt": b"new", "figures/tiny/g.txt": b"new", "data/results/tiny/t.csv": b"new",
        "notebooks/executed/tiny/97.ipynb": b"new"}
    assert not [p for p in root2.rglob("*.bak")]


def test_unwritable_destination_is_found_before_the_first_move(tmp_path, monkeypatch):
    from cancellation import staging
    root, st = _stage(tmp_path)
    res = st.final["results_dir"]
    if os.geteuid() == 0:   # root writes through chmod: make the directory unwritable another way
        real = staging.tempfile.mkstemp

        def ro(*a, dir=None, **k):
            if Path(dir) == res:
                raise PermissionError(13, "Permission denied")
            return real(*a, dir=dir, **k)
        monkeypatch.setattr(staging.tempfile, "mkstemp", ro)
    else:
        os.chmod(res, 0o555)
    before = _outputs(root)
    try:
        with st, pytest.raises(staging.PromotionError, match=rf"^{res}: not writable \(Permission denied\)$"):
            st.promote()
    finally:
        os.chmod(res, 0o755)
    assert _outputs(root) == before


def _probe_checkout(tmp_path) -> Path:
    """A checkout holding one one-cell notebook, 97_probe, and its tiny profile (for the runner's failures)."""
    root = tmp_path / "repo"
    (root / "notebooks/params").mkdir(parents=True)
    (root / "notebooks/params/tiny.yaml").write_text("97_probe:\n  value: 1\n")
    (root / "notebooks/97_probe.py").write_text('# %% tags=["parameters"]\nprofile = "tiny"\nvalue = 1\n')
    return root


def test_runner_reports_a_failed_promotion_in_one_line(tmp_path, monkeypatch, capsys):
    import papermill
    from cancellation import run, staging

    def executes(src, dst, **k):
        Path(dst).write_text(Path(src).read_text())

    def refuse(self, moves=None):
        raise staging.PromotionError("/x/figures/tiny: not writable (Permission denied)")
    monkeypatch.setattr(papermill, "execute_notebook", executes)
    monkeypatch.setattr(staging.Staging, "check_destinations", refuse)
    root = _probe_checkout(tmp_path)
    before = _outputs(root)
    with pytest.raises(SystemExit) as e:
        run.main(["97", "--root", str(root)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0] == ("error: 97_probe ran through but its outputs could not be promoted: /x/figures/tiny: not "
                      "writable (Permission denied); its figures, tables and executed notebook are unchanged")
    assert {k: v for k, v in _outputs(root).items() if not k.startswith("notebooks/executed")} == before
    assert not list((root / "notebooks/executed").rglob("*.ipynb"))


# ------------------------------------------------------------------ DATA-LOSS: the monitor's parquet parts
def _monitor(out):
    from cancellation.engine import monitor
    mon = monitor.CancellationMonitor(parquet=str(out))
    mon.trainer = object()  # attached (on_train_begin only reaches for the trainer when it is not)
    return mon


def _begin(mon, step):
    from transformers import TrainerControl, TrainerState
    mon.on_train_begin(None, TrainerState(global_step=step), TrainerControl())


def _steps(mon, *steps):
    mon._unwritten = [(s, pd.DataFrame({"step": [s, s], "fraction": [0.5, 0.5]})) for s in steps]
    mon._flush()


def test_monitor_resumed_run_keeps_earlier_steps(tmp_path):
    from cancellation import engine
    out = tmp_path / "cancellation"
    first = _monitor(out)
    _begin(first, 0)
    _steps(first, 1, 2)
    _steps(first, 3, 4, 5)  # flushed after the checkpoint at step 4; the run then died at step 5
    resumed = _monitor(out)
    _begin(resumed, 4)      # resume_from_checkpoint=checkpoint-4
    assert engine.read_parquet(out).step.tolist() == [1, 1, 2, 2, 3, 3, 4, 4]  # steps before the resume kept
    _steps(resumed, 5, 6)
    assert engine.read_parquet(out).step.tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]  # each step once
    fresh = _monitor(out)
    _begin(fresh, 0)        # a new run in the same directory replaces the monitor's own parts
    assert engine.read_parquet(out).empty and sorted(p.name for p in out.iterdir()) == [".monitor-parts.json"]


def test_monitor_never_deletes_a_part_file_it_did_not_write(tmp_path):
    out = tmp_path / "cancellation"
    out.mkdir()
    mine = out / "part-000000007.parquet"
    pd.DataFrame({"step": [7], "note": ["the user's own"]}).to_parquet(mine)
    data = mine.read_bytes()
    for step in (0, 3):     # a new run and a resumed one
        with pytest.raises(FileExistsError) as e:
            _begin(_monitor(out), step)
        assert len(str(e.value).splitlines()) == 1
        assert "part-000000007.parquet not written by the monitor" in str(e.value) and "move it away" in str(e.value)
        assert mine.read_bytes() == data
    own = _monitor(tmp_path / "other")
    _begin(own, 0)
    _steps(own, 1)
    (tmp_path / "other" / "part-000000002.parquet").write_bytes(data)  # appears while the run goes on
    with pytest.raises(FileExistsError, match="part-000000002.parquet: not written by the monitor; not overwritten"):
        _steps(own, 2)
    assert (tmp_path / "other" / "part-000000002.parquet").read_bytes() == data


# ------------------------------------------------------------------ CRASH/SILENT: bad profile YAML
LAUGHS = "01_token_flipping:\n  x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))


@pytest.mark.parametrize("name, content, expected", [
    ("syntax", "common:\n  seed: [1, 2\n  lr: 1\n", r"line 3, column \d+: YAML error: while parsing a flow sequence"),
    ("tag", "common:\n  seed: !!python/object/apply:os.system [echo pwned]\n",
     r"line 2, column \d+: YAML error: .*unsupported tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    ("latin1", "common:\n  seed: 1\n# caf\u00e9\n".encode("latin-1"), r"line 3: not UTF-8 text \(byte 23: b'\\xe9'\)"),
    ("intsection", "1:\n  seed: 1\n", r"line 1: section name '1' is not a name \(a string\)"),
    ("intkey", "common:\n  seed: 1\n  7: 2\n", r"line 3: parameter name '7' is not a name \(a string\)"),
    ("dupsection", "common:\n  seed: 1\n01_token_flipping:\n  steps: 2\ncommon:\n  seed: 2\n",
     r"line 5: duplicate section 'common' \(first at line 1\); the later one would silently win"),
    ("dupkey", "01_token_flipping:\n  steps: 2\n  lr: 0.1\n  steps: 3\n",
     r"line 4: duplicate key 'steps' \(first at line 2\); the later one would silently win"),
    ("laughs", LAUGHS, r"line \d+: aliases expand to more than 100000 values .*; refused"),
    ("recursive", "common: &c\n  seed: *c\n", r"line \d+: an alias refers to the node that contains it"),
])
def test_bad_profile_is_one_line_naming_file_and_line(tmp_path, monkeypatch, capsys, name, content, expected):
    import re
    from cancellation import profiles, run
    params = tmp_path / "params"
    params.mkdir()
    f = params / f"{name}.yaml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setattr(profiles, "HERE", dataclasses.replace(profiles.HERE, params=params))
    marker = Path("pwned")
    with pytest.raises(SystemExit) as e:
        run.main(["01", "--check", "--profile", name])
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and len(out.err) < 600, out.err[:2000]
    assert re.search(rf"^error: {re.escape(str(f))}: {expected}", err[0]), err[0]
    assert "Traceback" not in out.err and not marker.exists()


def test_error_lines_are_truncated_and_committed_profiles_load(capsys):
    from cancellation import profiles, resolve, run
    run._print_errors(ValueError("x" * 10_000 + "\nshort"))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and len(err[0]) < 600 and err[0].endswith("[9500 more characters]")
    for p in profiles.known_profiles():
        assert isinstance(profiles.load_profile(p), dict)
    with pytest.raises(profiles.ParameterError, match="duplicate key 'a'"):
        resolve._override_value("{a: 1, a: 2}", {})


# ------------------------------------------------------------------ POOR: absurd numbers refused at --check
def test_largest_seed_and_lr_allowed_pass_check(capsys):
    from cancellation import profiles, resolve
    p = resolve.resolve_params(profiles.find_notebook("01"), "tiny", {"seed": str(2**31 - 1), "lr": "1000", "n_prompts": "4"})
    assert p["seed"] == 2**31 - 1 and p["lr"] == 1000.0
    from cancellation import budget
    t = pd.DataFrame({"rollout": [0, 0, 1], "prob": [0.1, 0.2, 0.3], "position": [0, 1, 0]})
    assert len(budget.valued_tokens(t, [0, 1], 1, 0.5, seed=2**31 - 1)) == 2  # derived draws stay in range
    pd.testing.assert_frame_equal(budget.valued_tokens(t, [0, 1], 1, 0.5, seed=3),  # the same draws as before
                                  pd.concat([t[t.rollout == r].sample(n=1, random_state=3 * 100_003 + r)
                                             for r in (0, 1)]).reset_index(drop=True))


# ------------------------------------------------------------------ issue 50's leftovers: one line each
def test_profile_yaml_anchors_and_merge_keys_work(tmp_path, monkeypatch, capsys):
    """A standard way to share sizes between sections: an `x-` section holds the anchor, `<<: *name` merges
    it, an explicit key beside the merge wins (YAML's own rule)."""
    from cancellation import profiles, resolve
    params = tmp_path / "params"
    params.mkdir()
    (params / "anch.yaml").write_text("common:\n  seed: 3\nx-small: &small\n  n_prompts: 4\n  G: 4\n"
                                      "02_coupling_heatmaps:\n  <<: *small\n  G: 2\n")
    monkeypatch.setattr(profiles, "HERE", dataclasses.replace(profiles.HERE, params=params))
    got = resolve.resolve_params(profiles.find_notebook("02"), "anch")
    assert got["n_prompts"] == 4 and got["G"] == 2 and got["seed"] == 3


def test_the_same_notebook_named_twice_is_refused_in_one_line(capsys):
    from cancellation import run
    with pytest.raises(SystemExit) as e:
        run.main(["05", "05_value_gap", "--check"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == ["error: notebook 05_value_gap named more than once; name each notebook once"]


def test_a_cache_variable_naming_a_file_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("CANCELLATION_CACHE", str(f / "sub"))
    msg = cache.dir_problem(f / "sub")
    assert msg.startswith(f"CANCELLATION_CACHE={f / 'sub'}: {f} is a file, not a folder")
    assert cache.dir_problem(tmp_path / "new" / "dir") is None


def test_deeply_nested_json_in_a_problem_file_names_the_file_and_line(tmp_path):
    from cancellation import sources
    p = tmp_path / "deep.jsonl"
    p.write_text('{"prompt": "q", "answer": "1"}\n{"prompt": "q", "answer": "2", "extra": ' + "[" * 100_000
                 + "]" * 100_000 + "}\n")
    with pytest.raises(sources.ProblemFileError, match=r"deep.jsonl: line 2: JSON nested too deeply"):
        sources.ProblemSource(path=str(p)).load()


def test_a_negative_value_after_dash_p_meets_the_parameter_check(capsys):
    """`-p temperature -.inf` is read as a value (not an option): the runner's own check names it."""
    from cancellation import run
    with pytest.raises(SystemExit) as e:
        run.main(["02", "-p", "temperature", "-.inf", "--check"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "parameter 'temperature' = -inf: not finite" in err and "expected 2" not in err


def test_a_full_disk_while_the_notebook_is_written_is_one_line(tmp_path, monkeypatch, capsys):
    """Papermill runs out of space writing the executed notebook: one line says the disk is full, the
    committed outputs stay, and the cut-off notebook is not read back (no JSONDecodeError on top)."""
    import errno as _errno

    import papermill
    from cancellation import run

    def executes(src, dst, **k):
        Path(dst).write_text(Path(src).read_text()[:40])   # cut off part way
        raise OSError(_errno.ENOSPC, "No space left on device", str(dst))
    monkeypatch.setattr(papermill, "execute_notebook", executes)
    root = _probe_checkout(tmp_path)
    before = _outputs(root)
    with pytest.raises(SystemExit) as e:
        run.main(["97", "--root", str(root)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: 97_probe stopped: the disk is full (no space left writing ") and \
        err[0].endswith("its figures, tables and executed notebook are unchanged: free some space and run it again")
    assert _outputs(root) == before
