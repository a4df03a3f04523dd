#!/usr/bin/env bash
# Runs the GPU-marked tests (`gpu or multi_gpu`) on a CUDA host (a lent host with no package index:
# install what they need with scripts/device_kit.sh first).
#
#   bash scripts/run_gpu_tests.sh [extra pytest arguments, e.g. -x or tests/final/attention/test_final_gpu_attention.py]
#
# On a CUDA host a skipped GPU test is a failure: it means a kernel library, a GPU or a second
# GPU was missing, and the run proved nothing. So the script exits 1 when any test failed, was
# skipped (xfail included), or when no test ran at all. The junit XML and the log are written to
# ${OUT:-/tmp}/gpu-tests/ (junit.xml, pytest.log).
set -uo pipefail

cd "$(dirname "$0")/.."
out="${OUT:-/tmp}/gpu-tests"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

# A test still running after GPU_TEST_STACKS_AFTER_S seconds gets every thread's stack dumped into the
# log (pytest's faulthandler_timeout; the test goes on): a call cut off at its time limit then still
# says whether it was compiling kernels or waiting (2026-11-27: test-stage07's first test ran past
# a whole 540 s call and left nothing to read).
args=(-m "gpu or multi_gpu" -rs -o junit_family=xunit2 --junitxml="$out/junit.xml"
      -o faulthandler_timeout="${GPU_TEST_STACKS_AFTER_S:-240}")
if [ "$#" -eq 0 ]; then
  args+=(tests)
fi
"$python" -m pytest "${args[@]}" "$@" 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}

"$python" - "$out/junit.xml" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

junit, status = Path(sys.argv[1]), int(sys.argv[2])
if not junit.is_file():
    print(f"gpu tests: FAILED: pytest wrote no {junit} (exit status {status})")
    sys.exit(1)
cases = list(ET.parse(junit).getroot().iter("testcase"))
def outcome(case):
    for tag in ("failure", "error", "skipped"):
        child = case.find(tag)
        if child is not None:
            return tag, (child.get("message") or child.get("type") or "").strip()
    return "passed", ""
results = [(f"{c.get('classname')}::{c.get('name')}", *outcome(c)) for c in cases]
counts = {k: sum(1 for _, o, _ in results if o == k) for k in ("passed", "failure", "error", "skipped")}
for name, kind, message in results:
    if kind != "passed":
        print(f"gpu tests: {kind.upper()}: {name}: {message}")
print(
    f"gpu tests: {len(results)} ran: {counts['passed']} passed, {counts['failure']} failed, "
    f"{counts['error']} errors, {counts['skipped']} skipped (pytest exit status {status})"
)
if not results:
    print("gpu tests: FAILED: no GPU test ran (none collected or all deselected)")
    sys.exit(1)
if counts["skipped"]:
    print("gpu tests: FAILED: a skipped GPU test is a failure on a CUDA host")
    sys.exit(1)
if counts["failure"] or counts["error"] or status != 0:
    print("gpu tests: FAILED")
    sys.exit(1)
print("gpu tests: OK")
PY
