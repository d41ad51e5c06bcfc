"""Reference artifact for "The Cancellation Hypothesis in Critic-Free RL" (arXiv 2605.08666).

A small library behind one papermill-parameterised notebook per figure of the paper: a tiny
column-arithmetic task and policies trained for it (or real problem files and Hugging Face
causal LMs), GRPO rollouts with group-normalised advantages, per-token measurements of how
those advantages cancel across a batch (coupling, batching, categories, value estimates), a
content-addressed result cache, and a claims registry that decides, with a stated rule, whether
each of the paper's quantitative claims is reproduced. `python -m cancellation.run` runs the
notebooks. Importing the package loads nothing heavy (no torch); import the submodules you need.
"""
import os as _os

__version__ = "0.1.0"  # kept equal to pyproject.toml's [project] version (tests/test_packaging.py)

# A relative $CANCELLATION_CACHE means the caller's working directory: make it absolute here, in
# the first process that imports the package, so that processes it starts from another directory
# (notebook kernels run with the repository as working directory, spawned workers) use the same cache.
if _os.environ.get("CANCELLATION_CACHE") and not _os.path.isabs(_os.environ["CANCELLATION_CACHE"]):
    _os.environ["CANCELLATION_CACHE"] = _os.path.abspath(_os.path.expanduser(_os.environ["CANCELLATION_CACHE"]))
