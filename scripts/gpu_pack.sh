#!/usr/bin/env bash
# One file back from a device call that ran several `gpu_run.sh` groups side by side (each with its
# own OUT=$OUT/<group>, so their logs and test reports do not overwrite each other): every group's
# logs and reports, and the results written since the call began, into $1/results.tar, the rest of
# $1 removed (the device tool brings back at most eight files).
#
#   touch /tmp/call-start            # first thing in the call
#   OUT=$OUT/tp bash scripts/gpu_run.sh test-tp & CUDA_VISIBLE_DEVICES=3 OUT=$OUT/one bash scripts/gpu_run.sh decode-attn; wait
#   bash scripts/gpu_pack.sh $OUT    # last thing: tar -xf results.tar here, one folder per group
set -uo pipefail
root=${1:?usage: gpu_pack.sh OUT [START_MARKER]}
since=${2:-/tmp/call-start}
cd "$(dirname "$0")/.."
pack=$(mktemp /tmp/gpu-pack.XXXXXX)
tar -cf "$pack" -C "$root" --exclude='*.tar' . 2>/dev/null
new=$(find benchmarks/results benchmarks/profiles -newer "$since" -type f 2>/dev/null)
[ -n "$new" ] && tar -rf "$pack" $new
rm -rf "${root:?}"/* && mv "$pack" "$root/results.tar"
echo "packed $(tar -tf "$root/results.tar" | grep -vc '/$') files into $root/results.tar"
