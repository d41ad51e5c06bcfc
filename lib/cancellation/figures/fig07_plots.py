"""Notebook 07's figures: Fig. 8 (training curves) and Fig. 7(a) (what sign partitioning does).

Both read only what `fig07.Result.write` commits (curves, iterations, mini-batches, Table 2), so
`from_tables` rebuilds what they plot from data/results/<profile>/ without retraining.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import plots
from .. import stats as ST
from . import fig07


def _ci(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Mean over seeds and the 95% t half-width per x (0 from one seed)."""
    return df.groupby(x)[y].agg(["mean", ST.t_halfwidth]).fillna(0)


def rollout_labels(R, names) -> dict:
    """Legend label per strategy: its name, with its rollouts sampled as a multiple of the baseline's when that
    differs by more than 5% (Fig. 8's x-axis counts iterations, not rollouts)."""
    ratio = fig07.rollout_ratio(R)
    return {n: f"{n} ({ratio[n]:.1f}× rollouts)" if n in ratio and abs(ratio[n] - 1) > 0.05 else n for n in names}


def training_curves(R, strategies: list):
    """Fig. 8: held-out accuracy per set (and average), batch reward and token entropy vs iteration; mean over
    seeds with a 95% t band (cut at the quantity's range: [0, 1] for accuracies and rewards)."""
    label = rollout_labels(R, strategies)

    def band(ax, df, y, name, bounds=(-np.inf, np.inf), **kw):   # an accuracy's band is cut at [0, 1]
        ci = _ci(df, "iteration", y)
        ax.plot(ci.index, ci["mean"], color=fig07.COLORS[name], label=label[name], lw=1.3, **kw)
        ax.fill_between(ci.index, (ci["mean"] - ci.t_halfwidth).clip(*bounds), (ci["mean"] + ci.t_halfwidth).clip(*bounds),
                        color=fig07.COLORS[name], alpha=0.15, lw=0)

    acc_panels = R.cols if len(R.set_names) > 1 else R.set_names  # one held-out set: its average is itself
    n_panels = len(acc_panels) + 2
    rows = -(-n_panels // 3)
    fig, axes = plots.figure(ncols=3, nrows=rows, width=plots.WIDTH_2COL, height=1.95 * rows, squeeze=False)
    flat = list(axes.flat)
    for ax, c in zip(flat, acc_panels):
        for name in strategies:
            band(ax, R.curves[(R.curves.strategy == name) & (R.curves.set == c)], "accuracy", name, (0, 1),
                 marker="o", ms=2)
        ax.set(title=f"held-out: {c}", xlabel="iteration", ylabel="accuracy")
    upd = R.iters[R.iters.updated]
    for ax, y, title, bounds in ((flat[len(acc_panels)], "batch_acc", "training batch reward", (0, 1)),
                                 (flat[len(acc_panels) + 1], "entropy", "token entropy (batch)", (0, np.inf))):
        for name in strategies:
            band(ax, upd[upd.strategy == name], y, name, bounds)
        ax.set(title=title, xlabel="iteration")
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=4, frameon=False, fontsize=6)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def sign_partition(R, strategies: list):
    """Fig. 7(a): final held-out accuracy (seaborn bars, our 95% intervals), the mini-batch gradient norms and
    the drift |ρ − 1| within an iteration (95% t), random vs sign-partitioned (QB+RB for reference)."""
    fig, axes = plots.figure(ncols=3, width=plots.WIDTH_2COL, height=2.1)
    show = [s for s in ("random", "sign_partitioned", "QB+RB") if s in strategies]
    a = R.agg[R.agg.strategy.isin(show)].assign(acc=lambda t: 100 * t["mean"], lo=lambda t: t.acc - 100 * t.ci,
                                                 hi=lambda t: t.acc + 100 * t.ci)
    plots.bars(axes[0], a, "set", "acc", hue="strategy", lo="lo", hi="hi", order=R.cols, hue_order=show,
               palette={s: fig07.COLORS[s] for s in show})
    axes[0].axhline(R.start, color="k", lw=0.6, ls=":", label="start (avg)")
    axes[0].set(xlabel="", ylabel="final accuracy (%)", title="held-out accuracy", ylim=(0, 105))
    axes[0].legend(frameon=False, fontsize=5.5, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below the sets
    for name in [s for s in ("random", "sign_partitioned") if s in strategies]:
        d = R.minibatches[R.minibatches.strategy == name]
        gn = d.grad_norm[d.grad_norm > 0]  # a mini-batch of only A = 0 rollouts has no gradient
        axes[1].hist(np.log10(gn), bins=25, histtype="step", lw=1.2, color=fig07.COLORS[name], density=True,
                     label=f"{name} ({(d.composition == 'one sign').mean():.0%} one-sign)")
        k = _ci(d, "minibatch", "ratio_dev")
        axes[2].errorbar(k.index, k["mean"], yerr=k.t_halfwidth, color=fig07.COLORS[name], marker="o", ms=3, lw=1.2,
                         capsize=2, label=name)
    axes[1].set(xlabel="log10 mini-batch gradient norm", ylabel="density", title="update size",
                ylim=(0, axes[1].get_ylim()[1] * 1.45))   # room above the histograms for the legend
    axes[1].legend(frameon=False, fontsize=5.5, loc="upper center")
    axes[2].set(xlabel="mini-batch step within iteration", ylabel="mean |ρ − 1| (95% CI)", title="drift from θ_old")
    axes[2].legend(frameon=False, fontsize=6)
    fig.tight_layout()
    return fig


def from_tables(results_dir, P):
    """What the two figures read, from the committed tables: fig07.result_from_tables plus the held-out sets,
    Table 2's final accuracies per set (its mean and 95% half-width columns), the mini-batches' composition."""
    R = fig07.result_from_tables(results_dir, P)
    R.set_names = [s for s in R.curves.set.unique() if s != "average"]
    R.cols = R.set_names + ["average"]
    t = R.table2.set_index("strategy")
    R.agg = pd.DataFrame([dict(strategy=s, set=c, mean=t.loc[s, f"{c}_mean"] / 100, ci=t.loc[s, f"{c}_ci95"] / 100)
                          for s in t.index for c in R.cols])
    R.minibatches = fig07.with_composition(R.minibatches)
    return R
