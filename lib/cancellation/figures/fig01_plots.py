"""Notebook 01's figures: Fig. 1 (token flipping in a GRPO run and a positive-only run) and Fig. 9 (across models).

They read only what `fig01.Result.write` commits (`frac`: fig01_flip_fractions; the GRPO run's signed tokens:
fig01_token_deltas; `fig9`: fig09_flip_fractions), so they redraw from data/results/<profile>/ without training.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from .. import measure, plots

SIGN_SHORT = {"pos": "A > 0", "neg": "A < 0", "all": "all"}
SIGN_LS = {"pos": "-", "neg": "--"}       # Fig. 1(d): the rollout's sign by line style and marker,
SIGN_MARKER = {"pos": "o", "neg": "s"}    # the token's category by colour


def token_flipping(frac: pd.DataFrame, grpo_tokens: pd.DataFrame, eps: float):
    """Fig. 1: (a, b) shares of boosted / suppressed / stable tokens per step in positive and negative rollouts of
    the GRPO run; (c) |Δlog p| of the moved tokens (|Δ| > ε) by sign; (d) the positive-only run."""
    fig, axes = plots.figure(ncols=4, width=plots.WIDTH_2COL, height=2.3)
    for ax, sign, title in ((axes[0], "pos", "(a) positive rollouts"), (axes[1], "neg", "(b) negative rollouts")):
        d = frac[(frac.run == "grpo") & (frac.sign == sign)]
        for status in measure.STATUSES:
            s = d[d.status == status]
            ax.plot(s.step, s.fraction, marker="o", ms=2.5, lw=1.2, color=plots.STATUS_COLORS[status], label=status)
        ax.set(title=title, xlabel="training step", ylim=(0, 1))
    axes[0].set_ylabel("share of tokens")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False,
               bbox_to_anchor=(0.3, -0.02))
    d = grpo_tokens[grpo_tokens.status != "stable"]
    bins = np.linspace(np.log10(eps), np.log10(max(d.delta.abs().max(), 10 * eps)), 40)
    for sign in ("pos", "neg"):
        axes[2].hist(np.log10(d[d.sign == sign].delta.abs()), bins=bins, histtype="step", lw=1.2, density=True,
                     color=plots.SIGN_COLORS[sign], label=SIGN_SHORT[sign])
    axes[2].set(title="(c) |Δlog p|, GRPO run", xlabel="log10 |Δlog p|  (|Δ| > ε)", ylabel="density")
    axes[2].set_ylim(0, axes[2].get_ylim()[1] * 1.3)
    axes[2].legend(frameon=False, loc="upper right", fontsize=6)
    d = frac[(frac.run == "positive_only") & (frac.status != "stable")]
    for (sign, status), s in d.groupby(["sign", "status"]):
        axes[3].plot(s.step, s.fraction, marker=SIGN_MARKER[sign], ms=2.5, lw=1.2,
                     color=plots.STATUS_COLORS[status], ls=SIGN_LS[sign])
    axes[3].set(title="(d) positive-only run", xlabel="training step", ylim=(0, 1))
    # two encodings, one key below the panel: line style and marker = the rollout's sign, colour = the token's status
    signs = [s for s in ("pos", "neg") if s in set(d.sign)]
    statuses = [s for s in measure.STATUSES if s in set(d.status)]
    handles = ([Line2D([], [], color="0.3", marker=SIGN_MARKER[s], ms=2.5, lw=1.2, ls=SIGN_LS[s]) for s in signs]
               + [Line2D([], [], color=plots.STATUS_COLORS[s], lw=2.5) for s in statuses])
    fig.legend(handles, [f"{SIGN_SHORT[s]} rollouts" for s in signs] + [f"{s} tokens" for s in statuses],
               loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.87, -0.03), fontsize=6, handlelength=2.2,
               columnspacing=1.0, title="(d): line style = sign, colour = token", title_fontsize=6)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return fig


def across_models(fig9: pd.DataFrame):
    """Fig. 9: per model (rows) the share of boosted / suppressed / stable tokens (columns) among A > 0, A < 0
    and all rollouts."""
    n = fig9.model.nunique()
    fig, axes = plots.figure(ncols=3, nrows=n, width=plots.WIDTH_2COL, height=1.6 * n, squeeze=False)
    for i, (name, d) in enumerate(fig9.groupby("model", sort=False)):
        for j, status in enumerate(measure.STATUSES):
            ax = axes[i, j]
            for sign in ("pos", "neg", "all"):
                s = d[(d.sign == sign) & (d.status == status)]
                ax.plot(s.step, s.fraction, marker="o", ms=2, lw=1.1, color=plots.SIGN_COLORS[sign],
                        ls=":" if sign == "all" else "-", label=SIGN_SHORT[sign])
            ax.set(ylim=(0, 1), title=f"{name}: {status}")
            if i == n - 1:
                ax.set_xlabel("training step")
            if j == 0:
                ax.set_ylabel("share of tokens")
    axes[0, 0].legend(frameon=False)
    fig.tight_layout()
    return fig
