"""Re-record a notebook's claims from its committed tables, without rerunning it.

    python -m cancellation.rerecord 07 tiny-table2

Notebook 07 only (its training runs take hours for `tiny-table2`): the claims come from the tables
`fig07.load` reads back (the Result `R.write` wrote, as `make plots` reads it), so a changed claim rule
reaches the registry without retraining.
A top-layer tool: it resolves the profile as the runner does (`resolve.resolve_params`), as the notebook would.
"""
from __future__ import annotations

import argparse

from . import claims as C
from .profiles import HERE, find_notebook
from .resolve import resolve_params
from .figures import fig07, fig07_claims

# notebook: (its figure module: Params and load, its claims module: claims)
REREADERS = {"07": (fig07, fig07_claims)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m cancellation.rerecord")
    ap.add_argument("notebook", choices=sorted(REREADERS))
    ap.add_argument("profile", help="tiny or tiny-table2")
    a = ap.parse_args(argv)
    mod, rows = REREADERS[a.notebook]
    params = resolve_params(find_notebook(a.notebook), a.profile)
    P = mod.Params(**{k: v for k, v in params.items() if k in mod.Params.defaults()})
    results_dir = HERE.root / params["results_dir"]
    C.record(results_dir, a.notebook, rows.claims(mod.load(results_dir, P), P))


if __name__ == "__main__":
    main()
