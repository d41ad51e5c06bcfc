"""Notebook 07's figures: Fig. 8 (training curves) and Fig. 7(a) (what sign partitioning does).

Both read only what `fig07.Result.write` commits (curves, iterations, mini-batches, Table 2), so
`fig07.load(results_dir, P)` rebuilds what they plot from data/results/<profile>/ without retraining.
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


def training_curves(R, strategies: list, note: str | None = None):
    """Fig. 8 as small multiples: one column per strategy, each beside the baseline (random, black), one row per
    quantity (held-out accuracy per set and on average, batch reward, token entropy); mean over seeds with a 95% t
    band (cut at the quantity's range: [0, 1] for accuracies and rewards), accuracy and reward axes from 0. `note`:
    a headline over the panels (the light run says it is one)."""
    label = rollout_labels(R, strategies)
    base = "random" if "random" in strategies else strategies[0]
    others = [s for s in strategies if s != base] or [base]

    def band(ax, df, y, name, bounds=(-np.inf, np.inf), **kw):   # an accuracy's band is cut at [0, 1]
        ci = _ci(df, "iteration", y)
        ax.plot(ci.index, ci["mean"], color=fig07.COLORS[name], lw=1.1, **kw)
        ax.fill_between(ci.index, (ci["mean"] - ci.t_halfwidth).clip(*bounds), (ci["mean"] + ci.t_halfwidth).clip(*bounds),
                        color=fig07.COLORS[name], alpha=0.18, lw=0)

    acc_sets = R.cols if len(R.set_names) > 1 else R.set_names  # one held-out set: its average is itself
    upd = R.iters[R.iters.updated]
    rows = ([(f"held-out\n{c}", R.curves[R.curves.set == c], "accuracy", (0, 1), True) for c in acc_sets]
            + [("training\nbatch reward", upd, "batch_acc", (0, 1), True),
               ("token entropy\n(batch)", upd, "entropy", (0, np.inf), False)])
    fig, axes = plots.figure(ncols=len(others), nrows=len(rows), width=plots.WIDTH_2COL, height=1.0 * len(rows) + 0.9,
                             squeeze=False, sharex=True, sharey="row")
    evals = sorted(R.curves.iteration.unique())
    for r, (ylabel, df, y, bounds, from_zero) in enumerate(rows):
        for c, name in enumerate(others):
            ax = axes[r, c]
            marks = dict(marker="o", ms=1.8) if y == "accuracy" else {}
            for s in dict.fromkeys([base, name]):
                band(ax, df[df.strategy == s], y, s, bounds, **marks)
            if r == 0:
                ax.set_title(label[name].replace(" (", "\n("), fontsize=6.5, color=fig07.COLORS[name])
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=6.5)
            if r == len(rows) - 1:
                ax.set_xlabel("iteration", fontsize=6.5)
            ax.tick_params(labelsize=5.5)
        if from_zero:   # accuracies and rewards from 0 (the row shares its y-axis)
            axes[r, 0].set_ylim(0, min(1.0, axes[r, 0].get_ylim()[1]))
    n_seeds = R.curves.seed.nunique()
    lines = [f"each column: that strategy (colour) beside {base} (black); mean over {n_seeds} seed"
             f"{'s' if n_seeds != 1 else ''}, band: 95% t interval over seeds",
             f"held-out accuracy evaluated at iterations {', '.join(str(int(i)) for i in evals)} only (dots)"]
    fig.text(0.5, 0.0, "\n".join(lines), ha="center", va="bottom", fontsize=6.5)
    if note:   # the headline: what kind of run this is
        fig.suptitle(note, x=0.01, y=0.995, ha="left", va="top", fontsize=7.5, fontweight="bold", color="#D55E00")
    fig.tight_layout(rect=(0, 0.02 + 0.016 * len(lines), 1, 0.975 if note else 1), h_pad=0.3, w_pad=0.2)
    return fig


def _lr_text(lr: float) -> str:
    """3e-4 for 0.0003."""
    m, e = f"{lr:.0e}".split("e")
    return f"{m}e{int(e)}"


def lr_sweep(R, note: str | None = None):
    """Table 2's lr sweep (table2_lr_sweep): each run's final held-out average per strategy and lr (a dot per
    seed; a cross where the run collapsed, below half the start), the mean over seeds, the start and the collapse
    line; None without a sweep. `note`: a headline over the panel (the light run says it is one)."""
    sw = R.sweep
    if sw is None or sw.empty:
        return None
    names = [s for s in fig07.COLORS if s in set(sw.strategy)] + sorted(set(sw.strategy) - set(fig07.COLORS))
    lrs = sorted(sw.lr.unique())
    fig, ax = plots.figure(width=plots.WIDTH_2COL * 0.8, height=2.4)
    width = 0.7 / len(lrs)
    ticks, labels = [], []
    for i, name in enumerate(names):
        for n, lr in enumerate(lrs):
            d = sw[(sw.strategy == name) & (sw.lr == lr)]
            if d.empty:
                continue
            x = i + (n - (len(lrs) - 1) / 2) * width
            ticks.append(x)
            labels.append(_lr_text(lr))
            jitter = np.linspace(-0.25, 0.25, len(d)) * width if len(d) > 1 else np.zeros(1)
            for (_, row), dx in zip(d.iterrows(), jitter):
                ax.plot(x + dx, 100 * row.final, ls="none", marker="x" if row.collapsed else "o", ms=3.5,
                        color=fig07.COLORS.get(name, "0.3"))
            ax.plot([x - 0.4 * width, x + 0.4 * width], [100 * d.final.mean()] * 2, color="k", lw=0.9)
            ax.text(x, 100 * d.final.max() + 2, f"{int(d.collapsed.sum())}/{len(d)}", ha="center", va="bottom",
                    fontsize=5.5, color="0.3")
        ax.text(i, -0.16, name, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=7)
    ax.axhline(R.start, color="k", lw=0.6, ls=":", label=f"start ({R.start:.1f}%)")
    ax.axhline(R.start / 2, color="0.5", lw=0.6, ls="--", label="collapse line\n(half the start)")
    ax.set_xticks(ticks, labels, fontsize=6)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(-5, 100)
    ax.set_yticks([0, 25, 50, 75, 100])
    n_seeds = sw.groupby(["strategy", "lr"]).seed.nunique().max()
    ax.set(ylabel="final held-out average (%)",
           title=f"Table 2's lr sweep: {n_seeds} seed{'s' if n_seeds != 1 else ''} per strategy and lr")
    ax.plot([], [], ls="none", marker="o", color="0.3", ms=3.5, label="one run (seed)")
    ax.plot([], [], ls="none", marker="x", color="0.3", ms=3.5, label="one collapsed run")
    ax.plot([], [], color="k", lw=0.9, label="mean over seeds")
    ax.plot([], [], ls="none", label="n/m above a cell:\nruns collapsed")
    ax.legend(frameon=False, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if note:
        fig.suptitle(note, x=0.01, y=0.995, ha="left", va="top", fontsize=7, fontweight="bold", color="#D55E00")
    fig.tight_layout(rect=(0, 0, 1, 0.93 if note else 1))
    return fig


def sign_partition(R, strategies: list):
    """Fig. 7(a): (i) final held-out accuracy (seaborn bars, our 95% intervals), (ii) each mini-batch's gradient norm
    ‖g_B‖ (not Eq. 14's scatter Σ_B (T_B/T)‖g_B − g‖², which is Table 2's local-imbalance table) and (iii) the drift
    |ρ − 1| within an iteration (95% t), random vs sign-partitioned (QB+RB for reference)."""
    fig, axes = plots.figure(ncols=3, width=plots.WIDTH_2COL, height=2.1)
    show = [s for s in ("random", "sign_partitioned", "QB+RB") if s in strategies]
    a = R.agg[R.agg.strategy.isin(show)].assign(acc=lambda t: 100 * t["mean"], lo=lambda t: t.acc - 100 * t.ci,
                                                 hi=lambda t: t.acc + 100 * t.ci)
    plots.bars(axes[0], a, "set", "acc", hue="strategy", lo="lo", hi="hi", order=R.cols, hue_order=show,
               palette={s: fig07.COLORS[s] for s in show})
    axes[0].axhline(R.start, color="k", lw=0.6, ls=":", label="start (avg)")
    axes[0].set(xlabel="", ylabel="final accuracy (%)", title="(i) held-out accuracy", ylim=(0, 105))
    axes[0].legend(frameon=False, fontsize=5.5, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below the sets
    for name in [s for s in ("random", "sign_partitioned") if s in strategies]:
        d = R.minibatches[R.minibatches.strategy == name]
        gn = d.grad_norm[d.grad_norm > 0]  # a mini-batch of only A = 0 rollouts has no gradient
        axes[1].hist(np.log10(gn), bins=25, histtype="step", lw=1.2, color=fig07.COLORS[name], density=True,
                     label=f"{name} ({(d.composition == 'one sign').mean():.0%} one-sign)")
        k = _ci(d, "minibatch", "ratio_dev")
        axes[2].errorbar(k.index, k["mean"], yerr=k.t_halfwidth, color=fig07.COLORS[name], marker="o", ms=3, lw=1.2,
                         capsize=2, label=name)
    axes[1].set(xlabel="log10 ‖g_B‖ (one per mini-batch step)", ylabel="density",
                title="(ii) mini-batch gradient norm", ylim=(0, axes[1].get_ylim()[1] * 1.9))   # room for the key
    axes[1].text(0.5, 0.99, "‖g_B‖ itself, not Eq. 14's Σ_B (T_B/T)‖g_B − g‖²", transform=axes[1].transAxes,
                 ha="center", va="top", fontsize=5.5, color="0.3")
    axes[1].legend(frameon=False, fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, 0.92))
    axes[2].set(xlabel="mini-batch step within iteration", ylabel="mean |ρ − 1| (95% CI)", title="(iii) drift from θ_old")
    axes[2].legend(frameon=False, fontsize=6)
    fig.tight_layout()
    return fig
