#!/usr/bin/env bash
# Runs named steps on a CUDA host with the device kit installed (scripts/device_kit.sh), logging
# each to $OUT/logs/<step>.log and leaving benchmark JSON in benchmarks/results/<gpu>/; at the end
# everything new is packed into $OUT/results.tar so it can be brought back in one file.
#
#   bash scripts/gpu_run.sh env ckpt test-final bench-final peers
#
# Steps:
#   env           versions, the GPU, free memory
#   ckpt          the Qwen3-0.6B-shaped random checkpoint (checkpoints/qwen3-0.6b-random)
#   ckpt-8b       the Qwen3-8B-shaped one (checkpoints/qwen3-8b-random, 16 GB), for bench-tp
#   test-final    final/'s GPU tests that need no default model
#   test-all      every GPU test (needs the model kit)
#   test-tp       tensor parallelism's GPU tests (2 GPUs; TP=4 too on 4)
#   bench-final   batch-1 decode and the offline workload, graphs/overlap on and off
#   bench-tp      batch-1 decode and the offline workload at TP 1, 2 (and 4 on 4 GPUs), for the
#                 0.6B and 8B shapes (needs ckpt and ckpt-8b)
#   peers         Mini-SGLang's offline and batch-1 scripts from .peers/ (see shared/peers)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:.${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out/logs"
py=${GPU_PY:-python3}
ckpt=checkpoints/qwen3-0.6b-random
ckpt8=checkpoints/qwen3-8b-random
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[abhl][0-9]+' | head -1 | tr A-Z a-z)
gpu=${GPU_TAG:-${gpu:-gpu}}
results=benchmarks/results/$gpu
bench() { $py -m stages.common.bench --device cuda --dtype bfloat16 --model $ckpt --out $results --no-progress "$@"; }
bench_on() { local model=$1; shift; $py -m stages.common.bench --device cuda --dtype bfloat16 --model "$model" --out $results --no-progress "$@"; }

run_step() {
  case $1 in
    env)
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
      $py -c "import torch, flashinfer, transformers; print(torch.__version__, torch.version.cuda, flashinfer.__version__, transformers.__version__); print(torch.cuda.get_device_name(), torch.cuda.mem_get_info())"
      ;;
    ckpt) [ -f $ckpt/config.json ] || $py scripts/make_random_checkpoint.py --shape qwen3-0.6b --out $ckpt ;;
    ckpt-8b) [ -f $ckpt8/config.json ] || $py scripts/make_random_checkpoint.py --shape qwen3-8b --out $ckpt8 ;;
    test-final) OUT=$out bash scripts/run_gpu_tests.sh tests/test_final_gpu_kernels.py tests/test_final_gpu.py -k "not server and not bench_online" ;;
    test-all) OUT=$out bash scripts/run_gpu_tests.sh ;;
    test-tp) OUT=$out bash scripts/run_gpu_tests.sh tests/test_final_tp_gpu.py ;;
    bench-final)
      bench --engine final --workload latency --engine-arg attn=fi --name final_latency_fi_$gpu
      bench --engine final --workload latency --engine-arg attn=fi --engine-arg cuda_graph_max_bs=0 --engine-arg overlap=off --name final_latency_fi_eager_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name final_offline_fi_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg overlap=off --name final_offline_fi_nooverlap_$gpu
      ;;
    bench-tp)
      ngpu=$(nvidia-smi -L | wc -l)
      degrees="1 2"; [ "$ngpu" -ge 4 ] && degrees="1 2 4"
      for model in $ckpt $ckpt8; do
        shape=$(basename $model -random | tr -d '.-')  # qwen306b, qwen38b
        for tp in $degrees; do
          bench_on $model --engine final --workload latency --engine-arg attn=fi --engine-arg tp=$tp --name final_tp${tp}_latency_${shape}_$gpu
          bench_on $model --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg tp=$tp --name final_tp${tp}_offline_${shape}_$gpu
        done
      done
      ;;
    peers)
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py .peers/bench_minisgl.py $ckpt fi
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py .peers/latency_minisgl.py $ckpt 8
      ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

status=0
for step in "$@"; do
  echo "=== $step $(date +%T)"
  start=$(date +%s)
  run_step "$step" 2>&1 | tee "$out/logs/$step.log"
  rc=${PIPESTATUS[0]}
  echo "=== $step rc=$rc in $(( $(date +%s) - start )) s"
  [ "$rc" -ne 0 ] && status=$rc
done
tar -cf "$out/results.tar" -C "$out" logs $( [ -d "$out/gpu-tests" ] && echo gpu-tests ) 2>/dev/null
[ -d "$results" ] && tar -rf "$out/results.tar" "$results"
exit $status
