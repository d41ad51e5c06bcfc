"""One module per figure notebook: the analysis a notebook runs, cached in the library.

A stage's cache key is built here from every argument the stage reads (plus the Compute config
and the content fingerprints the caller passes as `inputs`), never in a notebook, so changing
any parameter recomputes. Notebooks call these functions, plot and read the results.
"""
