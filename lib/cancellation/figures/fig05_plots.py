"""Notebook 05's panels that are more than a few lines (the notebook keeps the rest), read off a
`fig05.Result`."""
from __future__ import annotations

from .. import plots
from .fig05 import Result

SIGN = {"all": "balanced", "pos": "A > 0", "neg": "A < 0"}


def strata(R: Result, est0: str):
    """Fig. 5(a) by token class and by confidence: per level, the value gap per rollout sign and balanced
    over signs with its 95% interval (query groups resampled), each level labelled with its token count."""
    fig, axes = plots.figure(ncols=2, width=plots.WIDTH_2COL * 0.75, height=2.0)
    for ax, col in zip(axes, ("category", "confidence")):
        d = R.strata[R.strata.by == col]
        levels = list(dict.fromkeys(d.level))
        plots.bars(ax, d.assign(who=d.sign.map(SIGN)), "level", "gap", hue="who", lo="lo", hi="hi", order=levels,
                   hue_order=[SIGN[s] for s in ("pos", "neg", "all")], legend=ax is axes[0],
                   palette={SIGN[s]: plots.SIGN_COLORS[s] for s in ("pos", "neg", "all")})
        ax.axhline(0, color="k", lw=0.5)
        n = d[d.sign == "all"].set_index("level").reindex(levels).eval("n_boosted + n_suppressed")
        ax.set_xticks(range(len(levels)), [f"{lv}\n(n={int(k)})" for lv, k in zip(levels, n)], fontsize=6)
        ax.set(title=f"value gap by {col} ({est0})", ylabel="boosted − suppressed Δ̂", xlabel="")
    axes[0].legend(frameon=False, fontsize=6)
    fig.tight_layout()
    return fig
