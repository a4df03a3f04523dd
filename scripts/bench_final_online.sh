#!/usr/bin/env bash
# The online benchmark against `python -m final` on a CUDA host: scripts/bench_server_online.py
# starts the server, polls /v1/models until it answers, sends Poisson arrivals at several rates
# (scripts/bench_online.py, text prompts as Mini-SGLang's server needs) and stops it.
#   bash scripts/bench_final_online.sh MODEL_DIR OUT_DIR NAME [RATES]
set -euo pipefail
model=$1; out=$2; name=$3; rates=${4:-8,32,64,inf}
exec ${GPU_PY:-python3} -m scripts.bench_server_online --engine final --model "$model" --out-dir "$out" \
  --name "$name" --rates "$rates" --port "${PORT:-19190}"
