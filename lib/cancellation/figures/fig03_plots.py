"""Notebook 03's figures, drawn from its Result (`fig03.compute` or `fig03.load`): Fig. 3 (a)–(c) and Fig. 10.

Kept apart from `fig03` (its Params, compute and tables: what the runner and the planner import) and its
claims (`fig03_claims`) so that neither imports matplotlib. Each function returns the figure; the notebook
saves it (`plots.save`) and shows it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import claims as C
from .. import plots
from .fig03 import Params, Result

LIN = 1e-9   # Fig. 3(a): the symlog x-axis is linear within ±LIN


def masked_updates(R: Result, P: Params, rows: list[C.Claim]):
    """Fig. 3: (a) every lm_head δ of the literal (nonzero) pool, both against random masks, with 3(a)'s
    right-shift row (`rows`: the notebook's claim rows, fig03_claims.claims); (b) the Boost Rate per
    proxy-cosine bin; (c) Boost Rate and Mean Boost as more top-coupled tokens are masked."""
    fig, axes = plots.figure(ncols=2, nrows=2, width=plots.WIDTH_2COL, height=4.9)
    axes = axes.ravel()
    lit = "nonzero" if "nonzero" in P.pools else P.pools[0]   # the paper's test taken literally (masks of both signs)
    _effects(axes[0], R, lit, rows)
    _boost_vs_cos(axes[1], R, P)
    _topk(axes[2], axes[3], R, P, lit)
    fig.legend(*axes[2].get_legend_handles_labels(), loc="lower center", ncol=2, frameon=False, fontsize=6,
               bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _effects(ax, R: Result, lit: str, rows: list[C.Claim]) -> None:
    """(a) every δ, tails included: symlog x (linear within ±LIN), counts on a log axis down to a single candidate."""
    e = R.effects[(R.effects.scope == "lm_head") & (R.effects.pool == lit)]
    top = float(np.abs(e.delta).max())
    pos_edges = np.logspace(np.log10(LIN), np.log10(top * 1.01), 22)
    edges = np.concatenate([-pos_edges[::-1], [0.0], pos_edges])
    t1 = R.table1.set_index(["pool", "kind", "scope"])
    for kind, color, name in (("random", plots.PALETTE[0], "random"), ("both", plots.PALETTE[1], "same + low conf.")):
        r = t1.loc[(lit, kind, "lm_head")]
        ax.hist(e[e.kind == kind].delta, bins=edges, histtype="step", lw=1.2, color=color,
                label=f"{name}: {r.mean_boost:+.1e} [{r.mean_boost_lo:+.1e}, {r.mean_boost_hi:+.1e}]")
    ax.set_xscale("symlog", linthresh=LIN, linscale=0.5)
    ax.xaxis.set_major_locator(plt.FixedLocator([-1e-2, -1e-5, 0, 1e-5, 1e-2]))
    ax.set_yscale("log")
    ax.set_ylim(0.5, ax.get_ylim()[1] * 60)   # a bin of one candidate shows; room above for the key
    shift = next((c for c in rows if c.claim == f"fig03a_{lit}_right_shift"), None)   # 3(a)'s test, with its interval
    if shift is not None:
        ax.text(0.01, 0.99, f"right-shift test, {shift.unit}:\n{shift.measured:+.1e} [{shift.lo:+.1e}, {shift.hi:+.1e}]"
                f" ({shift.verdict})", transform=ax.transAxes, ha="left", va="top", fontsize=5.5)
    ax.set(title=f"(a) δ, {lit} pool (literal test), n = {len(e[e.kind == 'both'])} per mask",
           xlabel="masking effect δ (lm_head; symlog, linear within ±1e-9)", ylabel="candidates per bin")
    ax.legend(frameon=False, fontsize=5.5, loc="upper left", bbox_to_anchor=(0, 0.86), title="Mean Boost [95% CI]",
              title_fontsize=5.5, alignment="left")


def _boost_vs_cos(ax, R: Result, P: Params) -> None:
    """(b) the Boost Rate per quantile bin of the proxy cosine, pools[0], both scopes."""
    for scope, ls in (("lm_head", "-"), ("full", "--")):
        s = R.boost_vs_cos[R.boost_vs_cos.scope == scope]
        ax.plot(s.proxy_cos, 100 * s.boost_rate, marker="o", ms=3, ls=ls, label=scope)
    ax.axhline(50, color="k", lw=0.5, ls=":")
    ax.set(title=f"(b) vs coupling, {P.pools[0]} pool", xlabel="proxy cos(g_c, Σ_M A_k g_k), bin median",
           ylabel="Boost Rate (%)", ylim=(-5, 105))
    ax.legend(frameon=False, loc="center right")
    ax.text(0.97, 0.06, "point estimates per cosine bin\n(no interval drawn)", transform=ax.transAxes,
            ha="right", va="bottom", fontsize=6, color="0.3")


def _topk(ax_rate, ax_mean, R: Result, P: Params, lit: str) -> None:
    """(c) both of 3(c)'s measures over k, each series nudged sideways so the intervals at one k stay apart."""
    series = [(p, scope) for p in [lit] + [q for q in P.pools if q != lit] for scope in ("lm_head", "full")]
    style = {(lit, "lm_head"): ("-", "o", plots.PALETTE[0]), (lit, "full"): ("none", "s", plots.PALETTE[1])}
    for n, (p, scope) in enumerate(series):
        t = R.topk[(R.topk.scope == scope) & (R.topk.pool == p)]
        if t.empty:
            continue
        ls, mk, color = style.get((p, scope), ("-" if scope == "lm_head" else "none", "o" if scope == "lm_head" else "s",
                                               "0.45" if scope == "lm_head" else "0.7"))
        xs = t.k * 2 ** (0.12 * (n - (len(series) - 1) / 2))
        label = f"{p} pool, {scope}" + (" (Boost Rate 100% by construction)" if p != lit and scope == "lm_head" else "")
        for ax, y, lo, hi, f in ((ax_rate, "boost_rate", "boost_rate_lo", "boost_rate_hi", 100),
                                 (ax_mean, "mean_boost", "mean_boost_lo", "mean_boost_hi", 1)):
            ax.errorbar(xs, f * t[y], yerr=plots.interval_err(f * t[y], f * t[lo], f * t[hi]), marker=mk,
                        ms=3 if p == lit else 2.5, ls=ls, color=color, capsize=1.5, lw=1 if p == lit else 0.8,
                        label=label)
    ks = sorted(R.topk.k.unique())
    for ax in (ax_rate, ax_mean):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("top-coupled tokens masked (k)")
    ax_rate.axhline(50, color="k", lw=0.5, ls=":")
    ax_rate.set(title="(c) top-coupled tokens masked: Boost Rate", ylabel="Boost Rate (%, 95% CI)", ylim=(-5, 105),
                yticks=[0, 25, 50, 75, 100])
    ax_mean.axhline(0, color="k", lw=0.5)
    ax_mean.set_yscale("symlog", linthresh=1e-4)
    ax_mean.set(title="(c) top-coupled tokens masked: Mean Boost", ylabel="Mean Boost (95% CI, symlog)")


def sign_consistency(R: Result):
    """Fig. 10: per training step, the share of response tokens whose Δlog p has the same sign under an
    lm_head and a full SGD step, against the paper's ≈ 0.7."""
    fig, ax = plots.figure(width=plots.WIDTH_1COL, height=2.0)
    ax.plot(R.consistency.step, R.consistency.sign_consistency, marker="o", ms=3, label="all response tokens")
    ax.axhline(0.7, color="k", lw=0.6, ls=":", label="paper (≈ 0.7)")
    ax.set(xlabel="training step", ylabel="same-sign share", ylim=(0, 1), title="lm_head vs full SGD step")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
