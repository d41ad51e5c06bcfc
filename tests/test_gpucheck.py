"""make gpu-check: refuses without a GPU (exit 2, one line), plans its steps under a budget, and renders
its report (the numbers in the markdown are the JSON's, rounded as stated)."""
import subprocess
import sys

import pytest
import torch

from cancellation import gpucheck


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_gpu():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no CUDA device" in p.stderr
    assert p.stdout == ""


def test_list_names_every_step_in_order():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck", "--list", "--notebooks", "05", "01"],
                       capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == ["pytest", "sampler", "profile", "units", "trim", "dry-05", "dry-01"]


def test_dry_overrides_per_notebook():
    o = gpucheck._dry_overrides("03")
    pairs = dict(zip(o[1::3], o[2::3]))
    assert o[0::3] == ["-p"] * len(pairs)
    assert pairs["mask_size"] == "1" and pairs["model_path"] == gpucheck.SHAPE and pairs["n_prompts"] == "4"
    o6 = gpucheck._dry_overrides("06")
    assert dict(zip(o6[1::3], o6[2::3]))["n_prompts"] == "16" and o6.count("n_prompts") == 1


def test_markdown_from_a_report():
    rep = dict(device=dict(date="2026-11-26", name="NVIDIA H200", kind="nvidia-h200", memory_gib=139.8,
                           torch="2.11.0"), budget_s=540, spent_s=500.2,
               steps=[dict(step="pytest", rc=0, seconds=80.0, output_tail="...\n10 passed in 70.1s\n"),
                      dict(step="sampler", rc=0, seconds=150.0,
                           rows=[dict(shape="64 x 512", way="ours", tokens_per_s=12345.6, first_call_s=3.21),
                                 dict(shape="64 x 512", way="weight-read limit", tokens_per_s=99999.0,
                                      first_call_s=None)]),
                      dict(step="units", rc=124, seconds=150.0),
                      dict(step="trim", rc=0, seconds=90.0,
                           trim=[dict(block="analysis_forward", rows=16, columns=1280, chunk_rows=4,
                                      positions_share=0.6234, seconds_full=2.0, seconds_trim=1.25, speedup=1.6,
                                      max_abs_diff=3.1e-6)]),
                      dict(step="dry-03", rc=0, seconds=60.0,
                           measured=dict(notebook="03_masked_updates", measured_seconds=61.4, peak_cuda_gib=40.0,
                                         planned=dict(predicted_seconds=40.0, peak_gib=50.0))),
                      dict(step="dry-05", skipped="budget: 20 s left, estimated 75 s")])
    md = gpucheck.markdown(rep)
    assert "| pytest | ok | 80.0 |" in md and "10 passed in 70.1s" in md
    assert "| units | timed out |" in md
    assert "| analysis_forward | 16 x 1280 | 4 | 62% | 2.00 | 1.25 | 1.60x | 3.1e-06 |" in md
    assert "| 64 x 512 | ours | 12,346 | 3.2 |" in md
    assert "| 03_masked_updates | 61 s, 40.0 GiB | 40 s, 50.0 GiB | 1.53x, 0.80x |" in md  # 61.4/40, 40/50
    assert "| 05 | not measured (budget: 20 s left, estimated 75 s) | | |" in md
