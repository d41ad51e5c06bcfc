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
