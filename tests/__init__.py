"""The test suite, laid out like the code it tests.

- engines/: every engine, each stage and final/ (stage_list.py names them): the same greedy tokens
  as HF transformers, the command-line rules, the samplers.
- stages/: each stage's invariants (test_stageNN_*.py; the *_gpu.py files need CUDA), the stage
  contract, bad input on the command line; stages/common/: the workloads, the bench harness and
  the detokenizer that every stage shares.
- final/: final/'s engine, one folder per sub-package that has several test files (attention,
  engine, scheduler, kvcache, kernels, distributed, frontend, server); the package as a whole
  (layering, copies, CLI, extension points, the offline API, the shell, a GPU end to end) at its top.
- tooling/: scripts/ (benchmarks, results, profiles, exercises), the docs and the built site, the
  Makefile, and the self-tests of fixtures/.

conftest.py's fixtures (the tiny checkpoints, the GPU skips) apply to every folder; fixtures/
holds the helpers the tests import (`tests.fixtures.*`). Every folder is a package, so pytest
imports a test file by its dotted name (`tests.final.server.test_final_server`) and puts only the
repository root on sys.path; the file names stay unique all the same, so `-k` and a basename in
the docs point at one file.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository, for tests that read its files
