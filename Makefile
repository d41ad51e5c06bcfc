# Targets (make help prints this):
#   make figures   set up .venv if missing, train the tiny policies if missing, run every notebook, then `make claims`
#   make figNN     rerun one notebook (fig01 ... fig08)
#   make plots     redraw every figure and record the claims again from the committed tables, computing nothing
#                  (a figure or claim-text fix needs no cold run; PROFILE=tiny also redraws tiny-table2's 07; NB=07: one)
#   make table2    the full Table 2 / Fig. 8 test (notebook 07, profile tiny-table2, 86 runs, 102 min cold on 2 cores)
#   make verify    compare data/results/ with the committed results (no rerun): every table within its stated
#                  tolerance, every verdict equal; exit 0 when within (A=dir B=dir: any two results folders)
#   make claims    regenerate README's claims table from data/results/tiny/claims.parquet (+ tiny-table2's)
#   make report    the browsable report: site/index.html, each figure beside its claims and verdicts, the executed
#                  notebooks as HTML (nbconvert), every claim (PROFILE=tiny; open site/index.html in a browser)
#   make test      the test suite on TEST_WORKERS pytest-xdist workers (CPU, about 14 min on 2 cores from a fresh clone)
#   make test-fast the tests that run no notebook and train nothing (pytest -m 'not slow')
#   make lint      ruff check (the rules in pyproject.toml; CI runs it before make test)
#   make bench     speed-ups and memory vs naive code (B=memory: one benchmark)
#   make gpu-check on a machine with an NVIDIA GPU: pytest -m gpu, the sampler vs transformers, the card's
#                  unit costs, dry runs at Qwen3-1.7B's shape; one report in data/scale/measured/ (BUDGET=540 s;
#                  PY=python3 uses an existing Python with torch instead of .venv). Without a GPU: exit 2
#   make plan      each notebook's planned peak memory and wall time, nothing run (PROFILE=paper-quick
#                  DEVICE=nvidia-h100-80gb-hbm3: on that kind's measured unit costs; PROCS=8 over 8 processes)
#   make env       create .venv from the lock: torch TORCH_SPEC, then requirements.lock (every other package pinned
#                  and hashed, --no-deps), then the library itself (editable); pip check at the end
#   make env-latest the newest versions inside pyproject's ranges in .venv-latest (torch stays TORCH_SPEC), which
#                  packages moved against the lock, then the test suite there; a failure says to hold the lock
#   make lock      requirements.lock (and environment.yml) from LOCK_FROM's freeze (default .venv-latest/bin/python,
#                  after make env-latest passed); hashes from the package index
#   make policy    retrain the tiny policies (tiny-m, tiny-s, tiny-m-fixed)
#   make standins  CPU stand-ins of the paper's model and data in data/standins/ (PROFILE=paper-smoke, paper-vocab)
#   make clean     remove caches, smoke/paper-smoke/paper-vocab/dry-run outputs and leftovers of killed runs
#   make help      this list
# Variables:
#   PROFILE=tiny   the parameter profile, a file in notebooks/params/ (tiny, tiny-table2, smoke, paper-smoke, paper-vocab, paper)
#   P='...'        parameter overrides for figures/figNN/table2: NAME=VALUE pairs separated by ';', each split on
#                  its first '=' (values parsed as YAML): P='steps=5; eval_sets=[easy, medium]; problems_path=a=b.jsonl'.
#                  They write to figures/<profile>/runs/<hash>/, data/results/<profile>/runs/<hash>/,
#                  notebooks/executed/<profile>/runs/<hash>/. Bad parameters stop before anything runs (exit 2).
#   REPLACE=1      with P, write the canonical (committed) outputs instead
#   CORES=N        cores make figures fills: each notebook pins its torch threads (one; 07: two workers x one),
#                  and they run in a pool, started in order while they fit (default: this machine's cores; 1: one
#                  at a time)
#   PROCS=N        make figNN: the notebook's independent work on N processes (--procs N: 01's runs, 04's batches,
#                  05's and 06's Monte Carlo continuations, 07's TRL runs on engine trl), the same tables as on one
#   B=NAME         the benchmark of make bench;  TORCH_SPEC=torch==2.x  the torch of make env;  PYTHON=python3
#   DEVICE=KIND    make plan's device kind (a file in data/scale/; default this host's)
#   BUDGET=S       make gpu-check's seconds (default 540: one 10-minute device call)
PROFILE ?= tiny
B ?=
BUDGET ?=
A ?=
P ?=
REPLACE ?=
CORES ?= $(shell nproc 2>/dev/null || echo 1)
PROCS ?=
NB ?=
DEVICE ?=
# pytest-xdist workers of make test / test-fast, one test file each at a time, in collection order (tests/conftest.py
# starts the longest files first; xdist would order files by their number of tests, putting them last) (0: no xdist)
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
PIP_SPEC ?= pip==26.3
LOCK := requirements.lock
VENV := .venv
LATEST := .venv-latest
LOCK_FROM ?= $(LATEST)/bin/python
PY := $(VENV)/bin/python
POLICIES := data/policies/tiny-m/model.safetensors data/policies/tiny-s/model.safetensors \
            data/policies/tiny-m-fixed/model.safetensors
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.py))
# P goes to the runner whole, single-quoted for the shell (a ' inside becomes '\''); it parses the pairs.
OVERRIDES := $(if $(strip $(P)),--set '$(subst ','\'',$(P))') $(if $(REPLACE),--replace)
export PYTHONUNBUFFERED := 1
# glibc malloc: blocks up to 1 GiB stay on the heap when freed, so (positions x 151,936) logits chunks do not fault
# their pages in afresh on every call (paper-vocab tests, the stand-ins' build; execute.MALLOC_ENV). Yours win.
export MALLOC_MMAP_THRESHOLD_ ?= 1073741824
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824

.PHONY: env env-latest lock plan policy standins figures plots table2 claims report verify test test-fast lint bench gpu-check clean help
help:
	@sed -n '/^# Targets/,/^[^#]/{/^#/s/^# \{0,1\}//p}' Makefile

env: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(PIP_SPEC)"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip check
	touch $@

# Not part of CI: a red suite here means "hold the lock", never a red main.
env-latest:  ## the newest versions in pyproject's ranges (torch held at TORCH_SPEC: eager upgrades would pull a CUDA build), what moved against the lock, the suite on them
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]" "$(TORCH_SPEC)"
	$(PYTHON) tools/lock.py diff $(LATEST)/bin/python
	$(LATEST)/bin/python -m pytest -q -x $(XDIST) \
	  && echo "env-latest: the suite passes on these versions: make lock moves the lock to them" \
	  || { echo "env-latest: the suite FAILS on the newest versions: keep the lock; the packages that moved are above"; exit 1; }

lock:  ## requirements.lock and environment.yml from LOCK_FROM's freeze (hashes from the index)
	$(PYTHON) tools/lock.py write $(LOCK_FROM)

# the control policy: tiny-m pretrained on traces with one wording per scaffold slot (Fig. 1(d), Fig. 4)
data/policies/tiny-m-fixed/model.safetensors: | env
	$(PY) -m cancellation.tiny --size tiny-m --scaffold fixed --out data/policies/tiny-m-fixed

data/policies/%/model.safetensors: | env
	$(PY) -m cancellation.tiny --size $* --out data/policies/$*

policy: env  ## retrain the tiny policies (tiny-m, tiny-s and the fixed-scaffold control tiny-m-fixed)
	$(PY) -m cancellation.tiny --size tiny-m --out data/policies/tiny-m
	$(PY) -m cancellation.tiny --size tiny-s --out data/policies/tiny-s
	$(PY) -m cancellation.tiny --size tiny-m --scaffold fixed --out data/policies/tiny-m-fixed

standins: env  ## CPU stand-ins of the paper's model and data (data/standins/, for PROFILE=paper-smoke)
	$(PY) -m cancellation.standins --out data/standins

figures: env $(POLICIES) $(if $(filter paper-smoke paper-vocab,$(PROFILE)),standins)
	$(PY) -m cancellation.run all --profile $(PROFILE) --cores $(CORES) $(OVERRIDES)
	$(MAKE) claims

plots: env  ## every figure redrawn from the committed tables (no computation), then README's claims
	$(PY) -m cancellation.run $(or $(NB),all) --profile $(PROFILE) --replot $(OVERRIDES)
	$(if $(and $(filter tiny,$(PROFILE)),$(filter all 07 07_batching,$(or $(NB),all))),\
	  $(PY) -m cancellation.run 07 --profile tiny-table2 --replot $(OVERRIDES))
	$(MAKE) claims

table2: env $(POLICIES)  ## the full Table 2 / Fig. 8 test: 10 seeds x 64 iterations, avg@4 on 256 problems, lr sweep
	$(PY) -m cancellation.run 07 --profile tiny-table2 $(OVERRIDES)
	$(MAKE) claims

claims: env  ## README's claims table from data/results/tiny/claims.parquet
	$(PY) -m cancellation.findings readme

report: env  ## the static site of PROFILE's executed notebooks and figures, in site/ (ignored)
	$(PY) -m cancellation.report --profile $(PROFILE) --out site

fig%: env $(POLICIES) $(if $(filter paper-smoke paper-vocab,$(PROFILE)),standins)
	$(PY) -m cancellation.run $* --profile $(PROFILE) $(if $(PROCS),--procs $(PROCS)) $(OVERRIDES)

plan: env  ## the planner: peak memory and wall time per notebook at PROFILE (DEVICE=kind, PROCS=N), runs nothing
	$(PY) -m cancellation.plan --profile $(PROFILE) $(if $(DEVICE),--device-kind $(DEVICE)) \
	  $(if $(PROCS),--procs $(PROCS)) $(OVERRIDES)

verify: env
	$(PY) -m cancellation.verify $(A) $(B)

test: env
	$(PY) -m pytest -q -x --durations=30 $(XDIST)

test-fast: env
	$(PY) -m pytest -q -x -m "not slow and not golden" $(XDIST)

lint: env
	$(PY) -m ruff check lib tests notebooks examples tools

bench: env $(POLICIES)
	$(PY) -m cancellation.bench $(B)

# No .venv when PY names another Python (a GPU image's own torch): no pip, lib/ on the path, the hub offline;
# gpu-check writes the stand-in data files its dry runs read itself (no stand-in model is trained).
gpu-check: $(if $(filter $(PY),$(VENV)/bin/python),env)
	PYTHONPATH="$(CURDIR)/lib$(if $(PYTHONPATH),:$(PYTHONPATH))" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	  $(PY) -m cancellation.gpucheck $(if $(BUDGET),--budget-s $(BUDGET))

clean:
	rm -rf data/cache notebooks/executed/smoke figures/smoke data/results/smoke .run-staging
	-find notebooks/executed -name '.*.tmp.ipynb' -delete
	rm -rf notebooks/executed/paper-smoke figures/paper-smoke data/results/paper-smoke
	rm -rf notebooks/executed/paper-vocab figures/paper-vocab data/results/paper-vocab dry-run
