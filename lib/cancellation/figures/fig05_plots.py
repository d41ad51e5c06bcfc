"""Notebook 05's figures, read off a `fig05.Result`: Fig. 5 (a, b), Fig. 14 (beyond the paper: 5(a)'s gap by token
class and confidence), Fig. 15 the value gap against its sign-shuffle null, and Fig. 11 (repeated steps)."""
from __future__ import annotations

import numpy as np

from .. import plots
from .fig05 import NULL_STATS, Params, Result, fig11_reads

SIGN = {"all": "balanced", "pos": "A > 0", "neg": "A < 0"}
EST_LABEL = {"paper": "Eq. 20:\n(avg₀ − avg₋₁)/(1 − p)", "exclude": "exclude:\navg₀ − avg₋ₒ"}
HAT = r"$\hat{\Delta}$"   # mathtext: the combining hat of "Δ̂" lands beside the Δ in matplotlib's fonts
VALUE = f"MC value {HAT}\n(counterfactual advantage)"
GAP = f"MC value gap {HAT}\n(boosted − suppressed)"
PAPER_PEAK = 40       # Fig. 5(b)'s peak in the paper, k in % of all tokens (the peak row's target)
WHISKER = "#888888"   # interval whiskers: visible on the black (balanced) bars and on white
# what the estimators read, under every figure that shows one (the notation of the notebook's first cell)
ESTIMATORS = (f"{HAT} = Monte Carlo counterfactual advantage of token o at state s, from M continuations each: avg₀ from "
              "s ⊕ o; avg₋₁ from s (first token from π); avg₋ₒ from s with o excluded from the first token. "
              "exclude = avg₀ − avg₋ₒ (the same target as Eq. 20 without its 1/(1 − p) factor).")


def _caption(fig, text: str, y: float = 0.0):
    fig.text(0.01, y, text, fontsize=5.5, ha="left", va="bottom", wrap=True, color="0.25")


def _whiskers(ax, color=WHISKER):
    for c in ax.containers:   # plots.bars draws our intervals as error bars (black): recolour them
        if type(c).__name__ == "ErrorbarContainer":
            for part in c.lines[2]:
                part.set_color(color)
            for part in c.lines[1]:
                part.set(color=color, markeredgecolor=color, markerfacecolor=color)


def value_gap(R: Result, P: Params):
    """Fig. 5: (a) mean Δ̂ per (rollout sign, status) per estimator, (b) the gap on the top-k% highest-entropy
    tokens (first estimator), its x-axis in % of the valued pool (bottom) and in % of all tokens (top: the unit
    of the peak's claim row)."""
    est0 = P.estimators[0]
    fig, axes = plots.figure(ncols=len(P.estimators) + 1, width=plots.WIDTH_2COL, height=3.0)
    for i, (ax, est) in enumerate(zip(axes, P.estimators)):
        d = R.cells[(R.cells.estimator == est) & R.cells.status.isin(["boosted", "suppressed"])]
        order = ["positive\nrollouts", "negative\nrollouts"]
        plots.bars(ax, d.assign(side=d.sign.map(dict(zip(("pos", "neg"), order)))), "side", "mean", hue="status",
                   lo="lo", hi="hi", palette=plots.STATUS_COLORS, alpha=0.85, legend=i == 0, order=order,
                   hue_order=["boosted", "suppressed"])
        ax.axhline(0, color="k", lw=0.5)
        ax.set(title=f"({'a' if i == 0 else 'a' + '′' * i}) {EST_LABEL[est]}", xlabel="",
               ylabel=f"mean {VALUE}" if i == 0 else None)
    axes[0].legend(frameon=False, loc="best", fontsize=6)
    ax = axes[-1]
    for sign in ("all", "pos", "neg"):
        d = R.entropy_gap[(R.entropy_gap.estimator == est0) & (R.entropy_gap.sign == sign)]
        ax.plot(d.k, d.gap, marker="o", ms=2.5, lw=1.4 if sign == "all" else 0.9, color=plots.SIGN_COLORS[sign],
                label=SIGN[sign])
        if sign == "all":
            ax.fill_between(d.k, d.lo, d.hi, color=plots.SIGN_COLORS[sign], alpha=0.12)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(title=f"(b) top-k% entropy ({est0})", ylabel=GAP,
           xlabel="top-k% highest entropy, % of the valued pool")
    ks, ka = np.asarray(P.entropy_k, float), np.asarray(R.peak.get("k_all", []), float)
    if len(ka) == len(ks) and np.all(np.diff(ka) >= 0):   # the same k as % of all tokens of mixed groups
        top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, ks, ka), lambda y: np.interp(y, ka, ks)))
        top.set_xticks([t for t in range(10, 100, 10) if ka[0] <= t <= ka[-1] - 4])
        top.set_xlabel("… as % of all tokens of mixed groups (the peak row's unit)", fontsize=6)
        top.tick_params(labelsize=6)
        if ka[0] <= PAPER_PEAK <= ka[-1]:   # the paper's peak, labelled on the line
            x40 = float(np.interp(PAPER_PEAK, ka, ks))
            ax.axvline(x40, color="0.5", lw=0.8, ls=":")
            ax.text(x40, 0.03, f" paper's peak\n ({PAPER_PEAK}% of all)", transform=ax.get_xaxis_transform(),
                    fontsize=5, color="0.35", ha="left", va="bottom")
    ax.legend(frameon=False, fontsize=6, loc="upper left")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    _caption(fig, ESTIMATORS + " Intervals: query groups resampled. (b): the peak row reads k in % of all tokens "
             "(top axis); a peak at the pool's last k reads 100%.")
    return fig


def strata(R: Result, est0: str):
    """Fig. 14 (beyond the paper), Fig. 5(a) by token class and by confidence: per level, the value gap per rollout sign and balanced
    over signs with its 95% interval (query groups resampled), each bar labelled with its token count."""
    fig, axes = plots.figure(ncols=2, width=plots.WIDTH_2COL * 0.8, height=2.3)
    for ax, col, letter in zip(axes, ("category", "confidence"), "ab"):
        d = R.strata[R.strata.by == col]
        levels = list(dict.fromkeys(d.level))
        hues = [SIGN[s] for s in ("pos", "neg", "all")]
        data = d.assign(who=d.sign.map(SIGN))
        plots.bars(ax, data, "level", "gap", hue="who", lo="lo", hi="hi", order=levels, hue_order=hues,
                   legend=ax is axes[0], palette={SIGN[s]: plots.SIGN_COLORS[s] for s in ("pos", "neg", "all")})
        _whiskers(ax)
        ax.axhline(0, color="k", lw=0.5)
        n = data.assign(n=data.n_boosted + data.n_suppressed).set_index(["level", "who"]).n
        for container, h in zip([c for c in ax.containers if type(c).__name__ == "BarContainer"], hues):
            for bar in container:
                lv = levels[int(round(bar.get_x() + bar.get_width() / 2))]
                if (lv, h) in n.index:   # below the axis, above the level's name
                    ax.annotate(f"{int(n[(lv, h)])}", (bar.get_x() + bar.get_width() / 2, 0), fontsize=5,
                                xycoords=("data", "axes fraction"), ha="center", va="top", xytext=(0, -2),
                                textcoords="offset points", color="0.3")
        ax.set_xticks(range(len(levels)), levels, fontsize=6)
        ax.tick_params(axis="x", pad=9)
        ax.set(title=f"({letter}) value gap by {col} ({est0})", ylabel=GAP if letter == "a" else "",
               xlabel="")
    axes[0].legend(frameon=False, fontsize=6)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _caption(fig, "Under each bar: n, the valued tokens (boosted + suppressed) its gap rests on. Whiskers: 95% CI, query "
             f"groups resampled. {HAT}: the {est0} estimator" + (" (avg₀ − avg₋ₒ: continuations from s ⊕ o against "
                                                                 "continuations from s with o excluded from the first "
                                                                 "token)." if est0 == "exclude" else "."))
    return fig


def null(R: Result, P: Params):
    """Fig. 15 (beyond the paper): the value gap after the real SGD step against the gaps after K steps with the advantages
    shuffled within groups (Fig. 11's pool): (a) both rollout signs pooled, (b) within sign, averaged."""
    t, tab = R.null_test, R.value_null
    fig, axes = plots.figure(ncols=2, width=plots.WIDTH_2COL * 0.8, height=2.6)
    cols = {"pooled": "gap", "balanced": "gap_balanced"}
    titles = {"pooled": "(a) both rollout signs pooled", "balanced": "(b) within sign, signs averaged"}
    for ax, name in zip(axes, NULL_STATS):
        x, g = t[name], tab[cols[name]].to_numpy()
        null_g = g[1:][np.isfinite(g[1:])]   # a split with no boosted or no suppressed token has no gap
        if len(null_g):
            ax.hist(null_g, bins=min(15, max(5, len(null_g) // 3)), color=plots.PALETTE[0], alpha=0.7,
                    label=f"{t['K']} steps with the advantages shuffled within groups")
        if np.isfinite([x["null_lo"], x["null_hi"], x["null_median"]]).all():
            ax.axvspan(x["null_lo"], x["null_hi"], color=plots.PALETTE[0], alpha=0.08, label="the shuffles' 95% band")
            ax.axvline(x["null_median"], color=plots.PALETTE[0], lw=0.8, ls="--", label="the shuffles' median")
        if np.isfinite(x["real"]):
            ax.axvline(x["real"], color=plots.PALETTE[1], lw=1.6, label="the real step")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.45)
        ax.set(title=titles[name], xlabel=GAP.replace("\n", " "),
               ylabel="shuffles" if name == "pooled" else "")
        ax.text(0.03, 0.97, f"real {x['real']:+.3f}, null median {x['null_median']:+.3f}\n"
                f"real − mean null {x['diff']:+.3f}\n[{x['lo']:+.3f}, {x['hi']:+.3f}], p = {x['p']:.3f}",
                transform=ax.transAxes, fontsize=5.5, va="top", ha="left",
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.1), ncol=4, frameon=False, fontsize=5.5)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    _caption(fig, f"Fig. 11's pool ({t['n_tokens']} tokens of {t['n_groups']} query groups, drawn before any step), "
             f"valued once; split by the real plain-SGD step (lr {t['lr']:g}) and by {t['K']} such steps whose advantages "
             f"were shuffled within each group. p = (1 + #null ≥ real)/(K + 1), resolution 1/(K + 1) = {1 / (t['K'] + 1):.3f}. Interval: query groups "
             "resampled, real and every shuffle recomputed on each draw.")
    return fig


def repeated(R: Result, P: Params):
    """Fig. 11: (a, b) the balanced value gap after each of K steps per optimizer and lr, the lr its claim row
    reads drawn thicker; (c) the share of the pool's statuses changed since step 1, with the rule's threshold
    (read at step K, marked)."""
    grid, reads = P.grid(), fig11_reads(R)
    col = {key: plots.PALETTE[i % len(plots.PALETTE)] for i, key in enumerate(grid)}   # one colour per run
    fig, axes = plots.figure(ncols=3, width=plots.WIDTH_2COL, height=2.75)
    K = P.repeat_steps
    for ax, o, letter in zip(axes[:2], ("sgd", "adam"), "ab"):
        lrs_o = [r for oo, r in grid if oo == o]
        for r in lrs_o:
            d = R.repeated[(R.repeated.optimizer == o) & (R.repeated.lr == r)]
            lr_row, reached = reads.get(o, (None, False))
            row = lr_row == r
            ch = f"{d.changed_status.iloc[-1]:.0%} changed by step {K}"
            ax.plot(d.step, d.gap, marker="o", ms=2.5, lw=1.5 if row else 0.9, color=col[(o, r)],
                    label=f"lr {r:g}" + ((f" (claim row:\n{ch} ≥ {P.nonlinear_share:.0%})" if reached else
                                          f" (claim row, the largest lr:\n{ch} < {P.nonlinear_share:.0%})")
                                         if row else ""))
            ax.fill_between(d.step, d.lo, d.hi, color=col[(o, r)], alpha=0.12)
        ax.axhline(0, color="k", lw=0.5)
        ax.set(title=f"({letter}) {'SGD' if o == 'sgd' else 'Adam'}: value gap ({P.estimators[0]})",
               xlabel="GRPO steps on the same batch", ylabel=f"sign-balanced value gap {HAT}" if letter == "a"
               else "")
        if lrs_o:
            ax.legend(frameon=False, fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1)
    ax = axes[2]
    for (o, r), d in R.repeated.groupby(["optimizer", "lr"], sort=False):
        ax.plot(d.step, 100 * d.changed_status, marker="o", ms=2.5, lw=1.0, color=col[(o, r)],
                ls="-" if o == "adam" else "--", label=f"{o} lr {r:g}")
        ax.plot([K], [100 * d.changed_status.iloc[-1]], marker="o", ms=5, mfc="none", mec=col[(o, r)], mew=0.9)
    ax.axhline(100 * P.nonlinear_share, color="k", lw=0.6, ls=":",
               label=f"{P.nonlinear_share:.0%}: the rule's threshold,\nread at step {K} (circled)")
    ax.set(title="(c) statuses changed since step 1", xlabel="GRPO steps on the same batch", ylabel="% of pool tokens")
    ax.legend(frameon=False, fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    fig.tight_layout()
    return fig
