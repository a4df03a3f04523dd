"""The book's tools: everything that is neither an engine nor a test.

Each script runs as a module from the repository root, `python -m scripts.NAME [ARGS]` (the
Makefile's targets and scripts/gpu_run.sh do exactly that), and imports its neighbours, `stages`,
`final` and `tests.fixtures` as packages: nothing here edits `sys.path` to find them
(tests/tooling/test_no_path_hacks.py keeps it so).

- measuring: bench_*.py, profile_decode*.py, kernel_table.py and kernel_breakdown.py,
  kv_fp8_*.py, stream_metrics.py, soak.py; make_random_checkpoint.py writes the checkpoints they
  run on. Results land in benchmarks/ as JSON.
- the book: render_results.py with results_*.py (tables and plots from those JSON files),
  render_diffs.py, render_profile.py, draw_*.py, docs_numbers.py and mkdocs_hooks.py (measured
  numbers and executed notebooks in the site), docs_assets.py, generated.py.
- the stage contract: stage_contract.py (what a stage may change) and propagate.py (a fix carried
  forward to the stages that copy the file).
- the exercises: exercise.py and exercise_stubs.py (`make exercise STAGE=NN`).
- a CUDA host: gpu_run.sh (the named GPU steps), run_gpu_tests.sh, device_kit.sh and
  bench_final_online.sh, run with bash.
"""
