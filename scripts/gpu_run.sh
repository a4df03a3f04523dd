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
#   test-final    final/'s GPU tests that need no default model
#   test-all      every GPU test (needs the model kit)
#   bench-final   batch-1 decode and the offline workload, graphs/overlap on and off
#   peers         Mini-SGLang's offline and batch-1 scripts from .peers/ (see shared/peers)
#   bench-ch04    chapter 04: long-prompt under mixed 2048/8192, prefill-first 8192, unchunked; 3 repeats
#   profile-ch01  chapter 01: where a batch-1 decode step goes, stage 01 against HF generate
#   ladder        the results page's ladder: offline workload, every stage, final/, Mini-SGLang, Nano-vLLM
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:.${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out/logs"
py=${GPU_PY:-python3}
ckpt=checkpoints/qwen3-0.6b-random
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[abhl][0-9]+' | head -1 | tr A-Z a-z)
gpu=${GPU_TAG:-${gpu:-gpu}}
results=benchmarks/results/$gpu
# Every result of this call carries the same id: the results page compares only rows that share it.
export BENCH_RUN_ID=${BENCH_RUN_ID:-gpu-$(date -u +%Y%m%dT%H%M%SZ)-$gpu}
bench() { $py -m stages.common.bench --device cuda --dtype bfloat16 --model $ckpt --out $results --no-progress "$@"; }

run_step() {
  case $1 in
    env)
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
      $py -c "import torch, flashinfer, transformers; print(torch.__version__, torch.version.cuda, flashinfer.__version__, transformers.__version__); print(torch.cuda.get_device_name(), torch.cuda.mem_get_info())"
      ;;
    ckpt) [ -f $ckpt/config.json ] || $py scripts/make_random_checkpoint.py --shape qwen3-0.6b --out $ckpt ;;
    test-final) OUT=$out bash scripts/run_gpu_tests.sh tests/test_final_gpu_kernels.py tests/test_final_gpu.py -k "not server and not bench_online" ;;
    test-all) OUT=$out bash scripts/run_gpu_tests.sh ;;
    bench-final)
      bench --engine final --workload latency --engine-arg attn=fi --name final_latency_fi_$gpu
      bench --engine final --workload latency --engine-arg attn=fi --engine-arg cuda_graph_max_bs=0 --engine-arg overlap=off --name final_latency_fi_eager_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name final_offline_fi_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg overlap=off --name final_offline_fi_nooverlap_$gpu
      ;;
    peers)
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py .peers/bench_minisgl.py $ckpt fi
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py .peers/latency_minisgl.py $ckpt 8
      ;;
    bench-ch04)
      ch04() { bench --engine stages.04_chunked_prefill --workload long-prompt --repeats 3 --engine-arg attn=fi --engine-arg page_size=16 "$@"; }
      ch04 --engine-arg max_prefill_length=2048 --engine-arg chunk_policy=mixed --name stage04_long_prompt_mixed_2048_$gpu
      ch04 --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=mixed --name stage04_long_prompt_mixed_8192_$gpu
      ch04 --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=prefill-first --name stage04_long_prompt_prefill_first_8192_$gpu
      ch04 --engine-arg max_prefill_length=65536 --engine-arg chunk_policy=prefill-first --name stage04_long_prompt_unchunked_$gpu
      ;;
    profile-ch01)
      for engine in stages.01_naive_generate hf; do
        tag=$([ $engine = hf ] && echo hf_ || true)
        $py scripts/profile_decode.py --engine $engine --device cuda --dtype bfloat16 --model $ckpt --out $results --name stage01_profile_${tag}$gpu
      done
      ;;
    ladder)
      bench --engine stages.01_naive_generate --workload offline --max-requests 16 --name ladder_stage01_$gpu
      for dir in stages/0[2-9]_*/; do
        stage=$(basename "$dir")
        bench --engine stages.$stage --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name ladder_stage${stage:0:2}_$gpu
      done
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name ladder_final_$gpu
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py scripts/bench_peer.py --engine mini-sglang --model $ckpt --out $results --name ladder_minisgl_$gpu
      PYTHONPATH=$PWD/.peers/nanovllm:$PYTHONPATH $py scripts/bench_peer.py --engine nano-vllm --model $ckpt --out $results --name ladder_nanovllm_$gpu \
        || echo "Nano-vLLM did not run (it needs FlashAttention 2): its ladder row stays empty"
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
