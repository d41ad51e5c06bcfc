import pytest

from cancellation import run


def test_profile_parameters_resolve_and_overrides_are_typed():
    nb = run.find_notebook("01")
    p = run.resolve_params(nb, "tiny", {"steps": "5", "lr": "1e-3", "models": "[data/policies/tiny-m]"})
    assert p["steps"] == 5 and p["lr"] == 1e-3 and p["models"] == ["data/policies/tiny-m"]
    assert p["fig_dir"].startswith("figures/tiny/runs/") and p["profile"] == "tiny"  # overrides: own directory
    assert run.resolve_params(nb, "tiny", {"steps": "5"}, replace=True)["fig_dir"] == "figures/tiny"
    assert run.resolve_params(nb, "tiny")["fig_dir"] == "figures/tiny"  # repository-relative: machine-independent
    assert run.resolve_params(nb, "tiny", {"lr": 1})["lr"] == 1.0  # int accepted for a float


def test_unknown_parameter_is_rejected_with_a_suggestion():
    nb = run.find_notebook("01")
    with pytest.raises(run.ParameterError, match="unknown parameter 'step'. Did you mean 'steps'"):
        run.resolve_params(nb, "tiny", {"step": "5"})


def test_wrong_type_is_rejected():
    nb = run.find_notebook("01")
    with pytest.raises(run.ParameterError, match="'steps' must be of type int"):
        run.resolve_params(nb, "tiny", {"steps": "five"})
    with pytest.raises(run.ParameterError, match="'steps' must be of type int"):
        run.resolve_params(nb, "tiny", {"steps": "2.5"})


def test_unknown_notebook_and_profile():
    with pytest.raises(run.ParameterError, match="known notebooks"):
        run.find_notebook("99")
    with pytest.raises(run.ParameterError, match="unknown profile"):
        run.resolve_params(run.find_notebook("01"), "huge")


def test_cli_exits_with_a_clear_message(capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["01", "-p", "sttps", "3", "--check"])
    assert e.value.code == 2
    assert "Did you mean 'steps'" in capsys.readouterr().err


def test_every_profile_section_passes_the_schema():
    for profile in ("tiny", "smoke", "paper", "paper-smoke"):
        for nb in run.all_notebooks():
            run.resolve_params(nb, profile)  # types, ranges, choices, constraints (paths not required to exist)


def test_schema_names_are_notebook_parameters():
    declared = {k for nb in run.all_notebooks() for k in run.notebook_defaults(nb)}
    schema = run.load_schema()
    names = set(schema["common"]) | {k for s, sec in schema.items() if s != "common" for k in sec if k != "constraints"}
    assert names <= declared, names - declared
    assert {k for k in declared if k not in run.INJECTED} - {"gradient_checkpointing"} <= set(schema["common"])


def test_executed_notebooks_keep_results_not_progress_bars(tmp_path):
    import json
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stderr", "text": ["\r", "train:  50%|█████     | 8/16 [00:17<00:19,  2.42s/it]"]},
        {"output_type": "stream", "name": "stderr", "text": ["/x/tqdm/auto.py:21: TqdmWarning: IProgress not found."]},
        {"output_type": "stream", "name": "stderr", "text": ["UserWarning: something real\n"]},
        {"output_type": "stream", "name": "stdout", "text": ["accuracy 0.50\n"]}]}], "metadata": {}}
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    run._strip_volatile(p)
    kept = json.loads(p.read_text())["cells"][0]["outputs"]
    assert [o["text"] for o in kept] == [["UserWarning: something real\n"], ["accuracy 0.50\n"]]
