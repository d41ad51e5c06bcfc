"""The figure manifest: one entry per notebook, the single place a figure is declared.

Each `Figure` names its notebook (`notebooks/<notebook>.py`), its library module
(`cancellation.figures.<module>`: Params, compute, workload, claims), the paper's panels it makes, the
cached stages it declares in `stage.py`, the names of the tables and figures it writes, one line on
what it measures, and what `make gpu-check` dry-runs it with. Everything that used to list the
notebooks reads this instead: the runner (which module holds a notebook's Params), the planner
(`plan.MODULES`), gpu-check (dry-run order, sizes and estimates), the tests (which notebook writes
which table; the notebook list) and the docs (README's and docs/figures.md's notebook tables,
written by `python -m cancellation.manifest docs`).

Naming scheme of outputs: every table and figure file starts with the paper's number of what it
shows, `figNN` or `tableN`, then an optional panel letter, then `_` and a name (`fig07b_group_trend`
is the paper's Fig. 7(b)). A notebook is named by its place in the artifact, so a notebook can make
panels of several paper figures (notebook 06 makes Fig. 6 and Fig. 7(b)); `owner(name)` says which
notebook wrote a file, from `outputs` here. Panels beyond the paper carry the next free number
(Fig. 12).

Adding a figure: a module in `cancellation/figures/`, its notebook, and one entry below (and its stages in
`stage.py` if it caches any; docs/architecture.md, "How to add a figure"). The tests that loop over figures read
FIGURES; `tests/test_manifest.py` adds a dummy one that way and runs those checks, a run and a replot on it.
"""
from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Figure:
    """One notebook and everything the artifact knows about it."""
    notebook: str                      # the notebook's stem: notebooks/<notebook>.py (its first two characters: its key)
    module: str                        # the library module: cancellation.figures.<module> (Params, compute, workload)
    panels: tuple[str, ...]            # the paper's panels it makes, in the paper's numbering
    outputs: tuple[str, ...]           # the paper numbers its table and figure files start with (see the naming scheme)
    stages: tuple[str, ...]            # the cached stages its module declares in stage.py (by name)
    about: str                         # one line: what it measures (README's and docs/figures.md's tables)
    dry: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # gpu-check's dry-run sizes beyond DRY_SIZES
    dry_seconds: int | None = None     # a dry run's measured seconds at those sizes, 10 s added (None: never measured)
    dry_first: bool = False            # gpu-check dry-runs it before every other notebook
    package: str = "cancellation.figures"   # where `module` lives (a test's dummy figure lives elsewhere)

    @property
    def key(self) -> str:
        return self.notebook[:2]

    def load(self):
        """The figure's library module."""
        return importlib.import_module(f"{self.package}.{self.module}")

    def owns(self, name: str) -> bool:
        """Whether a table or figure file `name` is one of this notebook's outputs."""
        return any(re.match(re.escape(p) + (r"_" if p[-1].isalpha() else r"[a-z]?_"), name) for p in self.outputs)


def _fig(notebook, module, panels, outputs, stages, about, dry=None, dry_seconds=None, dry_first=False) -> Figure:
    return Figure(notebook, module, tuple(panels), tuple(outputs), tuple(stages), about,
                  MappingProxyType(dict(dry or {})), dry_seconds, dry_first)


# gpu-check's dry runs are paper-quick's sections at these sizes on top of gpucheck.DRY_SIZES (Qwen3-1.7B's shape,
# random weights, 128 new tokens, 4 prompts), each planned at about a minute on an H200 (85 s: 04). None is measured
# at these sizes yet (the 2026-11-26 H200 seconds were paper-vocab's at 16 new tokens): dry_seconds stays None.
_SHAPE = "data/shapes/qwen3-1.7b-base"


FIGURES: list[Figure] = [
    _fig("01_token_flipping", "fig01", ["Fig. 1", "Fig. 9"], ["fig01", "fig09"], ["fig01_noise_floor"],
         "how one GRPO step moves each token's log-probability, by advantage sign and confidence; across models",
         dry=dict(models=[_SHAPE], steps=1, fig9_steps=1)),
    _fig("02_coupling_heatmaps", "fig02", ["Fig. 2"], ["fig02"], ["fig02"],
         "the coupling kernel ⟨h_j,h_k⟩·φ between tokens of opposite-sign rollouts; first-order fidelity of δ_j",
         dry=dict(n_pairs=5000)),
    _fig("03_masked_updates", "fig03", ["Fig. 3", "Table 1", "Fig. 10", "App. D.3"], ["fig03", "table1", "fig10"],
         ["fig03", "masked_full", "masked_topk_full", "sign_consistency_run"],
         "updates masked to token subsets (Boost Rate, Mean Boost); lm_head vs full-parameter sign consistency",
         dry=dict(mask_size=1, n_cands=4, n_cands_full=1, run_steps=1, run_n_prompts=2, topk_sizes=[1, 2],
                  topk_full_sizes=[2], n_cands_topk_full=1, run_G=4)),
    _fig("04_category_shift", "fig04", ["Fig. 4", "Fig. 13", "thesis"], ["fig04", "fig13"], ["category_shift"],
         "mass shift per token category, positive-only vs GRPO; the thesis as rows that could fail (shared vs "
         "success-specific tokens, Algorithm 2)",
         dry=dict(fo_tokens=64, n_batches=2, null_shuffles=2)),
    _fig("05_value_gap", "fig05", ["Fig. 5", "Fig. 11", "Fig. 14", "Fig. 15"], ["fig05", "fig11", "fig14", "fig15"], ["fig05", "repeated_deltas", "value_null"],
         "Monte Carlo value of boosted vs suppressed tokens; repeated updates with SGD and Adam",
         dry=dict(M=4, n_per_cell=4, heldout_per_cell=0, n_pool11=4, adam_lrs=[1.0e-6], repeat_steps=3,
                  null_shuffles=2)),
    _fig("06_sampling_budget", "fig06", ["Fig. 6", "Fig. 7(b)"], ["fig06", "fig07b"], ["fig06", "budget_sweep_nested"],
         "the value gap vs prompts per update, rollouts per prompt and positives per group",
         dry=dict(n_prompts=16, prompt_sizes=[4, 16], rollout_sizes=[1, 8], prompts_fixed=4, comp_prompts=4,
                  comp_G=6, G_comp=2, comp_groups=2, n_seeds=2, M=4)),
    _fig("07_batching", "fig07", ["Fig. 7(a)", "Fig. 8", "Table 2", "Eq. 14"], ["fig07a", "fig08", "table2"],
         ["train_trl", "local_imbalance"],
         "batching strategies (random / QB / RB / QB+RB / sign-partitioned) over seeds, with fair controls",
         dry=dict(seeds=[0], iterations=1, eval_every=1, eval_sets=["data/standins/math500.jsonl"], eval_n=8,
                  trl_strategies=["QB+RB"], trl_seeds=[0], probe_strategies=[], imbalance_plans=0,
                  strategies=["QB+RB"]),
         dry_first=True),   # paper-quick's least certain time (TRL), never dry-run at its own backend
    _fig("08_referee_controls", "fig08", ["Fig. 12"], ["fig12"], ["fig12"],
         "beyond the paper: frequency-matched and within-token-id controls, kernels by confidence bin",
         dry=dict(steps=1, n_full_tokens=16, grad_chunk=2)),
]


# ----------------------------------------------------------------------------- lookups
def get(ref: str) -> Figure:
    """The figure of a notebook key ("05") or stem ("05_value_gap")."""
    for f in FIGURES:
        if ref in (f.key, f.notebook, f.notebook + ".py"):
            return f
    raise KeyError(f"no figure {ref!r} in the manifest (cancellation/manifest.py); known: "
                   f"{', '.join(f.notebook for f in FIGURES)}")


def find(ref: str) -> Figure | None:
    try:
        return get(ref)
    except KeyError:
        return None


def keys() -> list[str]:
    return [f.key for f in FIGURES]


def owner(name: str) -> Figure | None:
    """The figure whose notebook writes the table or figure file `name` (None: not a figure's output)."""
    hits = [f for f in FIGURES if f.owns(name)]
    return hits[0] if len(hits) == 1 else None


# ----------------------------------------------------------------------------- docs
DOC_BEGIN, DOC_END = "<!-- manifest:begin -->", "<!-- manifest:end -->"


def table_markdown() -> str:
    """The notebook table README and docs/figures.md show."""
    lines = ["| notebook | paper | files | what it measures |", "|---|---|---|---|"]
    for f in FIGURES:
        files = ", ".join(f"`{p}_*`" for p in f.outputs)
        lines.append(f"| `{f.notebook}.py` | {', '.join(f.panels)} | {files} | {f.about} |")
    return "\n".join(lines)


def with_table(text: str) -> str:
    """`text` with the block between the manifest markers replaced by today's table."""
    a, b = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    return text[:a] + "\n" + table_markdown() + "\n" + text[b:]


DOCS = ("README.md", "docs/figures.md")


def write_docs(root: Path = ROOT) -> list[str]:
    """Rewrite the manifest block of each of DOCS; returns the files that changed."""
    changed = []
    for rel in DOCS:
        p = root / rel
        old = p.read_text()
        new = with_table(old)
        if new != old:
            p.write_text(new)
            changed.append(rel)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["docs"]:
        sys.exit("usage: python -m cancellation.manifest docs   (rewrites the notebook tables of "
                 + " and ".join(DOCS) + ")")
    print("\n".join(f"wrote {c}" for c in write_docs()) or "docs already match the manifest")
