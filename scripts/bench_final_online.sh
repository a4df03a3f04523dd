#!/usr/bin/env bash
# The online benchmark against `python -m final` on a CUDA host: start the server, wait until it
# answers /health, send Poisson arrivals at several rates (scripts/bench_online.py), stop it.
#   bash scripts/bench_final_online.sh MODEL_DIR OUT_DIR NAME [RATES]
set -euo pipefail
model=$1; out=$2; name=$3; rates=${4:-8,32,inf}
py=${GPU_PY:-python3}
port=${PORT:-19190}
log=$(mktemp)
$py -m final --model "$model" --device cuda --attn fi --page-size 16 --port "$port" --log-level warning >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do  # model load and FlashInfer's first compiles take a while
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 1
done
$py scripts/bench_online.py --url "http://127.0.0.1:$port" --rates "$rates" --out-dir "$out" --name "$name"
