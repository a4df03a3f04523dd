#!/usr/bin/env bash
# Copy final/ as it was at each given commit into .latency-trees/<commit>/final (ignored by git), for
# `gpu_run.sh latency-trees`, which times the batch-1 step of each in one device call (carry the
# folder: about 1 MiB a tree). Each folder is named by the commit's short hash, so HEAD or a branch
# name is recorded as the commit it was. Usage: scripts/export_trees.sh 857cfb0 10344dd HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .latency-trees
for commit in "$@"; do
  short=$(git rev-parse --short=7 "$commit")
  mkdir -p ".latency-trees/$short"
  git archive "$commit" final | tar -x -C ".latency-trees/$short"
  echo "$commit: $short $(git log -1 --format=%s "$commit" | cut -c1-80)"
done
