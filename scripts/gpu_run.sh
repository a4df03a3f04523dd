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
#   fi-warmup     first on a fresh machine without a carried JIT cache: FlashInfer's kernels compiled in
#                 parallel, one process per kernel family through final/'s own calls
#                 (scripts/flashinfer_warmup.py; FI_WARMUP_FP8=1 adds the FP8-cache kernels)
#   ckpt-8b       the Qwen3-8B-shaped one (checkpoints/qwen3-8b-random, 16 GB), for bench-tp
#   test-final    final/'s GPU tests that need no default model
#   test-all      every GPU test (needs the model kit)
#   test-tp       tensor parallelism's GPU tests (2 GPUs; TP=4 too on 4)
#   bench-final   batch-1 decode and the offline workload, graphs/overlap on and off
#   kernels       final/kernels checked against their torch references and timed (K/V write, fused
#                 norm + RoPE + K/V write, sampling, small-M GEMV; scripts/bench_kernels.py), into
#                 benchmarks/results/<gpu>/kernels_<gpu>.json; its table and the GEMV advice in the log
#   decode-attn   bench_kernels' decode-attention part alone: FlashInfer's decode on tensor cores
#                 against CUDA cores, eager and as the engine's graphs run it, even and uneven
#                 lengths, into logs/kernels_decode_attn_<gpu>.json (the tensor-core rule's map)
#   test-kernels  tests/final/kernels/test_final_gpu_kernels.py alone: the kernels against their references, the
#                 engine with them against without (test-final runs it too)
#   test-attn     the attention backends' GPU tests (kernels, graphs, engines): on a fresh machine
#                 most of the time goes to compiling kernels, so one call may not hold them all;
#                 test-attn-fa, test-attn-fi, test-attn-trtllm and test-attn-engine split them;
#                 test-attn-compile: only FlashAttention 4's compile counts and its replay against its call
#   bench-attn    offline throughput, batch-1 decode and batch-1 prefill (512, 2048, 8192 tokens) per
#                 attention backend and pair (ATTN_SPECS="fi fa ..." picks some; about 80 s each),
#                 into benchmarks/results/<gpu>/attn_<workload>_<backends>_<gpu>.json; then prints
#                 which wins each phase (scripts/results_attention.py), for AUTO
#   test-stage05  stage 05's GPU tests (real CUDA graphs against eager decode)
#   bench-stage05 stage 05's decode step at batch 1, 8, 64 and 256, graphs on and off
#   bench-stage05-offline  stage 05's offline workload, graphs on and off
#   profile-stage05  one decode step, eager and replayed, under the torch profiler (batch 1 and 64)
#   bench-tp      batch-1 decode and the offline workload at TP 1, 2 (and 4 on 4 GPUs), for the
#                 0.6B and 8B shapes (needs ckpt and ckpt-8b)
#   bench-tp-one-shot  the same grid with FINAL_CUSTOM_ALL_REDUCE=1 (final/distributed/one_shot.py:
#                 small all-reduces over NVLink by FlashInfer's one-shot kernel), final_oneshot_tp*
#   test-stage06  stage 06's GPU tests (overlap on against off, the launch path never waits)
#   bench-stage06 stage 06's offline workload, overlap on and off
#   bench-stage06-online  stage 06's online workload in-process at 16 requests/s, overlap on and off
#   profile-stage06  8 consecutive steps at batch 64, overlap off and on, under the torch profiler
#   profile-final 8 consecutive steps of final/ as it serves (CUDA graphs and overlap on) and with
#                 both off, under the torch profiler (batch 1 and 64)
#   offline-phases  final/'s offline run (versus's workload) split into prefill steps, full-batch decode
#                 and the draining tail, time and tokens of each (scripts/bench_offline_phases.py; about a
#                 minute), into final_offline_phases_<gpu>.json: where the H100's offline gap is
#   pdl-ab        final/'s batch-1 step (latency workload, 3 runs) with programmatic dependent launch
#                 and with FINAL_PDL=0, in one call: final_latency_pdl1_<gpu>.json, _pdl0_; then the
#                 decode step's kernels at batch 1, 64 and 256 with PDL off, as shipped (the fused K/V
#                 kernel's up to PDL_MAX_TOKENS) and everywhere: logs/pdl_kernels_{off,shipped,all}.json
#   latency-trees the batch-1 step of each final/ in .latency-trees/ (scripts/export_trees.sh COMMIT...;
#                 carry the folder), LATENCY_ROUNDS rounds alternating them: when a step time moved
#   tc-ab         FlashInfer's decode on tensor cores for Qwen3-0.6B's group of 2, per arm of TC_ARMS
#                 (batch:context, default "0:0 64:0 64:1024 64:768"): from that batch on (FINAL_TC_MIN_BATCH, 0:
#                 never) where the step's mean context is at least that (FINAL_TC_MIN_CONTEXT, 0: any):
#                 the offline workload, 2 runs each: final_offline_tc<batch>[_ctx<context>]_<gpu>.json
#                 (session 16 ran batch bounds at any context; shipped since: 64 and 768); a third field,
#                 the contexts' spread in percent (FINAL_TC_MIN_SPREAD): _spread<N> in the name
#   pdl-bound     the fused K/V kernel's PDL bound by step time, not busy time (which leaves out the
#                 gaps between kernels that PDL closes): final/'s decode step at each batch of
#                 PDL_BATCHES (default 1 2 4), 3 runs each, the kernel on PDL (FINAL_PDL_MAX_TOKENS=256)
#                 and off it (=0): final_decode_b<N>_pdl_{on,off}_<gpu>.json (session 16's runs at
#                 batch 8 and 64 named the arm "shipped": the bound was 64 then, so on)
#   prefill-host  per backend (ATTN_SPECS, default "fi fa"), the host's launch time of a batch-1 prefill
#                 at 512, 2048, 8192 tokens against the whole prefill (scripts/bench_prefill_host.py), into
#                 logs/prefill_host.json: a slower first token from the kernels or from the host (issue 26);
#                 ATTN_SPECS="fa fa:no-replay": FlashAttention 4 with and without its call replayed
#   prefill-kernels  the GPU kernels of one prefill of 32 fresh 512-token prompts, final/ and Mini-SGLang
#                 (scripts/kernel_table.py --prefill-prompts; needs .peers), into logs/prefill_kernels_*.json
#   test-stage07  stage 07's GPU tests (TP=2, and TP=4 on 4 GPUs, against TP=1; a killed rank)
#   bench-stage07 stage 07's batch-1 decode and offline workload at TP 1, 2 (and 4 on 4 GPUs), for the
#                 0.6B and 8B shapes (needs ckpt and ckpt-8b)
#   peers         Mini-SGLang (source in .peers/minisgl, see shared/peers) on our offline and batch-1
#                 workloads, as results (scripts/bench_peer.py); run it in the call of bench-final
#   bench-final-online  final/'s OpenAI server under Poisson arrivals at ONLINE_RATES (default
#                 8,32,64,inf requests/s): TTFT, ITL, throughput per rate (scripts/bench_server_online.py),
#                 into final_online_<gpu>_rate<R>.json
#   peers-online  the same against Mini-SGLang's server (python -m minisgl from .peers/minisgl; fi,
#                 page size 1, graphs to 256), into peer_minisgl_online_<gpu>_rate<R>.json; run it in
#                 the call of bench-final-online: the Performance page pairs them by rate and run id
#   online-policy issue 27's call: final/'s server as served (--attn auto, or ONLINE_FINAL_ATTN) under
#                 --chunk-policy mixed (the default, named as
#                 bench-final-online names it) and prefill-first, and Mini-SGLang's server, one after
#                 the other at ONLINE_RATES (default 8,32,64,inf), ONLINE_REQUESTS (default 256) each,
#                 with final/'s per-token engine timestamps (the engine/frontend split, burst shares)
#                 and its engine's step trace: logs/steps_<name>.jsonl.gz, logs/bursts_<name>.json;
#                 about 2 minutes a server on an H200 with the FlashInfer cache carried (80 s of
#                 requests: 256 at 8/s alone take 32 s), 7 minutes with `ckpt`: under the 10-minute
#                 limit; each server's results are packed into $OUT/partial-online.tar as soon as they exist;
#                 ONLINE_SERVERS (default "mixed prefill-first minisgl"; "catch-up": final/ with
#                 --stream-catch-up-ms ONLINE_CATCH_UP_MS, default 50) picks which servers run
#   fiws-save     end a call with it: FlashInfer's JIT cache into $OUT/fiws.tar.N (15 MB parts); copy
#                 them to .fiws-cache/full/ here (fiws-stash and fiws-restore bring them back)
#   fiws-stash    a carried part of the cache (.fiws-cache/full/fiws.tar.N) kept in /tmp/fiws-parts/: a
#                 cache of more than about 60 MB comes over two calls beside a kit part
#   fiws-restore  the carried cache (the stashed parts, else .fiws-cache/slim.tar) unpacked with its
#                 files dated now, and the kit's files dated 2000: FlashInfer runs ninja before every
#                 load, and the kit's sources, installed minutes ago, were newer than the cache, so
#                 ninja may compile every kernel again (sessions 6-8 spent 146-190 s of each machine
#                 in fi-warmup with a cache carried; fi-warmup now says what it compiled)
#   bench-stage01 stage 01's batch-1 decode and HF transformers' generate on it (3 repeats each)
#   bench-stage02 stage 02 (fi): batch-1 decode, the offline workload, and at scale 0.25 fi against torch
#   bench-stage03 stage 03 (fi, page 16): shared-prefix and no-sharing workloads, radix against naive
#   bench-ch04    chapter 04: long-prompt under mixed 2048/8192, prefill-first 8192, unchunked; 3 repeats
#   profile-ch01  chapter 01: where a batch-1 decode step goes, stage 01 against HF generate
#   ladder        the results page's ladder: offline workload, every stage, final/, Mini-SGLang, Nano-vLLM
#   bench-policy  final/'s offline workload under --chunk-policy mixed and prefill-first (Mini-SGLang's
#                 way: a step with prefill work carries nothing else), at the default budget
#   versus        final/ against Mini-SGLang in one call, both measured by the same code: the offline
#                 workload and the batch-1 decode step (VERSUS_REPEATS, default 3, alternating the
#                 engines) and the kernel table of a decode step at batch 1 and 256, greedy and 0.6
#                 (scripts/bench_versus.py), into versus_minisgl_<gpu>.json with every ratio; final/
#                 at --attn auto as it serves (fa,fi on Hopper with the fa kit, fi without it),
#                 Mini-SGLang at fi; VERSUS_FINAL_ATTN=fi: both on FlashInfer (versus_minisgl_fi_<gpu>.json)
#   graph-launch  final/'s CUDA graph launches as it serves, without a profiler: the host's time in
#                 each and the share that found the GPU drained (scripts/bench_graph_launch.py), batch
#                 1 and 64, into final_graph_launch_<gpu>.json: is the batch-1 idle the launch? (needs ckpt)
#   api-cost      the server's CPU time per streamed frame and per request on this host's CPU, process
#                 by process (scripts/bench_api_cost.py: the real server over a stand-in engine with a
#                 5 ms step; about a minute), into final_api_cost_<gpu>.json: can the API process
#                 write the frames per second of the online table? (needs ckpt, for its tokenizer)
#   gc-freeze     a full garbage collection in each server process before and after its start-up freeze
#                 (scripts/bench_gc_freeze.py, the stand-in engine; half a minute), final_gc_freeze_<gpu>.json
#   host-step     the host's CPU time per decode step of final/, by phase, at batch 64 and 256 on this
#                 host's CPU (scripts/bench_host_step.py: the GPU's parts stood in; the GPU is idle),
#                 table in the log, JSON in logs/host_step.json: does the host set the pace?
#   kv-fp8-bound  the FP8 KV cache where the cache limits the batch: 256 prompts of 2k-4k tokens, 512
#                 output tokens each, at kv-fp8-speed's small --memory-ratio (bf16 holds about 100 of
#                 them at once, FP8 twice as many), bf16 then FP8; about 2 minutes on an H200
#   kv-fp8        the FP8 KV cache (issue 32), its four parts below, about 8 minutes on an H200 whose
#                 FlashInfer cache (.fiws-cache) has the bf16 kernels; needs ckpt, and the model kit
#                 for the default model. Results kv_*_<gpu>.json, rendered on docs/serving/kv_fp8.md
#   test-kv-fp8   the FP8 KV cache's GPU tests (FlashInfer and XQA over FP8, graphs, capacity), about
#                 3 minutes with FlashInfer's FP8 kernels to compile
#   kv-fp8-accuracy  greedy agreement and |d logprob| of FP8 against bf16, 200 prompts x 64 tokens, on
#                 the default model and the Qwen3-0.6B shape, fi (scripts/kv_fp8_accuracy.py)
#   kv-fp8-capacity  tokens in the pool and 8k-context requests that fit, bf16 and FP8, --memory-ratio
#                 0.9 (scripts/kv_fp8_capacity.py)
#   kv-fp8-kernel FlashInfer's decode layer-call at issue 32's shapes, bf16/FP8 x CUDA/tensor cores
#                 (scripts/bench_kv_fp8_decode.py): its table re-measured
#   kv-fp8-speed  bf16 against FP8 (fi, page 16): offline, batch-1 decode, long-context (64 prompts of
#                 4k-16k) at --memory-ratio 0.9 and at KV_FP8_SMALL_RATIO (default 0.32 on an H200,
#                 0.53 on an H100: about 40 GB of KV, where bf16 holds half the requests, FP8 all)
set -uo pipefail
cd "$(dirname "$0")/.."
# The second entry: the CuTe DSL's `cutlass` (see scripts/device_kit.sh), which FlashAttention 4 imports.
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:.${PYTHONPATH:+:$PYTHONPATH}
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
# The commit measured: a lent host's copy of the tree does not carry this checkout's git state, so
# write it beside the tree before the call (`git describe --always --dirty --abbrev=12 > .bench-commit`,
# carried with the call) and every result records it (stages/common/hardware.py, BENCH_GIT_COMMIT).
[ -f .bench-commit ] && export BENCH_GIT_COMMIT=${BENCH_GIT_COMMIT:-$(cat .bench-commit)}
# Every result of this call carries the same id: the results page compares only rows that share it.
export BENCH_RUN_ID=${BENCH_RUN_ID:-gpu-$(date -u +%Y%m%dT%H%M%SZ)-$gpu}
bench() { $py -m stages.common.bench --device cuda --dtype bfloat16 --model $ckpt --out $results --no-progress "$@"; }
bench_on() { local model=$1; shift; $py -m stages.common.bench --device cuda --dtype bfloat16 --model "$model" --out $results --no-progress "$@"; }

# bench-tp's and bench-stage07's grid: batch-1 decode and the offline workload at TP 1, 2 (and 4 on
# 4 GPUs), for the 0.6B and 8B shapes, named <prefix>_tp<N>_<workload>_<shape>_<gpu>.
# Usage: bench_tp_grid ENGINE PREFIX [ARG...], the ARGs passed to the latency runs only.
# TP_MODELS="0.6b" or "8b" runs one shape (a call of its own each where the whole grid would not fit in
# one 10-minute call); TP_DEGREES overrides the degrees. Each run's result is packed into
# $OUT/partial-tp.tar as soon as it exists, so a call cut off at its limit keeps what ran.
bench_tp_grid() {
  local engine=$1 prefix=$2 degrees="1 2" models="" model shape tp
  shift 2
  [ "$(nvidia-smi -L | wc -l)" -ge 4 ] && degrees="1 2 4"
  degrees=${TP_DEGREES:-$degrees}
  case " ${TP_MODELS:-0.6b 8b} " in *" 0.6b "*) models="$ckpt" ;; esac
  case " ${TP_MODELS:-0.6b 8b} " in *" 8b "*) models="$models $ckpt8" ;; esac
  for model in $models; do
    shape=$(basename $model -random | tr -d '.-')  # qwen306b, qwen38b
    for tp in $degrees; do
      bench_on $model --engine $engine --workload latency --engine-arg attn=fi "$@" --engine-arg tp=$tp --name ${prefix}_tp${tp}_latency_${shape}_$gpu
      keep_partial tp
      bench_on $model --engine $engine --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg tp=$tp --name ${prefix}_tp${tp}_offline_${shape}_$gpu
      keep_partial tp
    done
  done
}

# A call cut off at its time limit never reaches the results.tar at the end: steps that write many
# results re-pack what they have so far into one file under $OUT after each part (the device tool
# brings back at most 8 files, none deeper than two folders).
keep_partial() { tar -cf "$out/partial-$1.tar" "$results" 2>/dev/null || true; }

run_step() {
  case $1 in
    env)
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
      $py -c "import torch, flashinfer, transformers; print(torch.__version__, torch.version.cuda, flashinfer.__version__, transformers.__version__); print(torch.cuda.get_device_name(), torch.cuda.mem_get_info())"
      $py -c "import importlib.metadata as m, flash_attn.cute, cutlass; print('flash-attn-4', m.version('flash-attn-4'), 'nvidia-cutlass-dsl', m.version('nvidia-cutlass-dsl'))"
      $py -c "import torch; from final.attention.choose import resolve_attention as r; c = r('auto', 'cuda', torch.bfloat16); print('auto:', c.label, 'page size', c.page_size)"
      ;;
    fiws-save)  # the FlashInfer JIT cache as it stands, in 15 MB parts (the tool brings back files of
      # at most 16 MiB): copy them to .fiws-cache/ here, and the next call compiles nothing again.
      # A call brings back at most 8 files and about 64 MiB in all: a cache of more than four parts
      # comes back over two calls, FIWS_FROM=4 keeping parts 4 and up (2026-11-27: 5 parts, 67 MB).
      tar -C "$(dirname $FLASHINFER_WORKSPACE_BASE)" -cf - "$(basename $FLASHINFER_WORKSPACE_BASE)" | split -b 15m -d -a 1 - "$out/fiws.tar."
      for part in "$out"/fiws.tar.*; do [ "${part##*.}" -lt "${FIWS_FROM:-0}" ] && rm "$part"; done; ls -l "$out"/fiws.tar.* ;;
    fiws-stash) mkdir -p /tmp/fiws-parts && cp .fiws-cache/full/fiws.tar.* /tmp/fiws-parts/ 2>/dev/null; ls /tmp/fiws-parts ;;
    fiws-restore)
      local into parts
      into=$(dirname $FLASHINFER_WORKSPACE_BASE)
      parts=$(ls /tmp/fiws-parts/fiws.tar.* 2>/dev/null | sort -t. -k3 -n)
      # The cache's files keep the times they were built at (no `tar -m`): with -m each file is
      # dated by when it came out of the archive, and a module whose .so comes before its objects
      # in the archive (norm, rope, sampling, ... : ten of them in session 10's log) looks older
      # than its inputs, so ninja links it again in every session.
      if [ -n "$parts" ]; then cat $parts | tar -C "$into" -xf -
      elif [ -f .fiws-cache/slim.tar ]; then tar -C "$into" -xf .fiws-cache/slim.tar
      else echo "no FlashInfer cache carried: every kernel compiles on first use"; fi
      # And the kit's files (the headers and sources the modules were built from) dated before
      # the cache: the kit was installed minutes ago, which would make every module look stale.
      [ -d /tmp/site ] && find /tmp/site -type f -exec touch -h -d 2000-01-01 {} +
      du -sh "$FLASHINFER_WORKSPACE_BASE" 2>/dev/null ;;
    fi-warmup) $py -m scripts.flashinfer_warmup ${FI_WARMUP_FP8:+--fp8} ;;
    ckpt) [ -f $ckpt/config.json ] || $py -m scripts.make_random_checkpoint --shape qwen3-0.6b --out $ckpt --force ;;  # no config.json: cut off, begun again
    ckpt-8b) [ -f $ckpt8/config.json ] || $py -m scripts.make_random_checkpoint --shape qwen3-8b --out $ckpt8 --force ;;
    test-final) OUT=$out bash scripts/run_gpu_tests.sh tests/final/kernels/test_final_gpu_kernels.py tests/final/test_final_gpu.py tests/final/engine/test_final_penalties.py -k "not server and not bench_online" ;;
    test-all) OUT=$out bash scripts/run_gpu_tests.sh ;;
    kernels) $py -m scripts.bench_kernels --out $results/kernels_$gpu.json ;;
    decode-attn) $py -m scripts.bench_kernels --only decode-attention --out "$out/logs/kernels_decode_attn_$gpu.json" ;;
    test-kernels) OUT=$out bash scripts/run_gpu_tests.sh tests/final/kernels/test_final_gpu_kernels.py ;;
    test-tp) OUT=$out bash scripts/run_gpu_tests.sh tests/final/distributed/test_final_tp_gpu.py ;;
    bench-final)
      bench --engine final --workload latency --engine-arg attn=fi --name final_latency_fi_$gpu
      bench --engine final --workload latency --engine-arg attn=fi --engine-arg cuda_graph_max_bs=0 --engine-arg overlap=off --name final_latency_fi_eager_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name final_offline_fi_$gpu
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg overlap=off --name final_offline_fi_nooverlap_$gpu
      ;;
    test-attn) OUT=$out bash scripts/run_gpu_tests.sh tests/final/attention/test_final_gpu_attention.py ;;
    test-attn-fa|test-attn-fi|test-attn-trtllm)  # one backend's kernel and graph tests
      b=${1#test-attn-}
      OUT=$out bash scripts/run_gpu_tests.sh tests/final/attention/test_final_gpu_attention.py \
        -k "kernels_match_the_torch_backend[$b- or eager_torch[$b] or ${b}_prefill_outside or ${b}4_compiles or ${b}4_replay or ${b}_plans_from_pinned" ;;
    test-attn-engine) OUT=$out bash scripts/run_gpu_tests.sh tests/final/attention/test_final_gpu_attention.py -k "engine or auto" ;;
    test-attn-compile)  # issue 26's proof, about a minute: FlashAttention 4 compiles nothing per length, and its replay matches
      OUT=$out bash scripts/run_gpu_tests.sh tests/final/attention/test_final_gpu_attention.py -k "fa4_compiles or fa4_replay" ;;
    bench-attn)
      # Every backend and pair at page size 16 (one every kernel takes): the offline workload, batch-1
      # decode (latency) and batch-1 prefill at 512, 2048 and 8192 tokens, one fresh process each,
      # one run each (the prefill workload takes the median of 5 prompts per length itself); about
      # 8 minutes on a Hopper GPU with FlashInfer's kernels already compiled (.fiws-cache).
      # FlashAttention 4 keeps its compiled kernels on disk here, as FlashInfer does (its own
      # FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED, flash_attn/cute/cache_utils.py), so each fresh process
      # loads rather than recompiles them; the warm-up excludes either way. FA4_DISK_CACHE=0: off.
      if [ "${FA4_DISK_CACHE:-1}" = 1 ]; then
        export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-cache
      fi
      cc=$($py -c "import torch; print(torch.cuda.get_device_capability()[0])")
      specs=${ATTN_SPECS:-"fa fi fa,trtllm fi,trtllm fi,fa fa,fi"}  # the fix and its yardstick first
      [ "$cc" = 10 ] && specs=${ATTN_SPECS:-"$specs trtllm"}  # TRT-LLM prefills on 10.x only
      for spec in $specs; do
        tag=${spec//,/-}
        attn=(--engine-arg attn=$spec --engine-arg page_size=16)
        bench --engine final --workload offline "${attn[@]}" --name attn_offline_${tag}_$gpu
        bench --engine final --workload latency "${attn[@]}" --name attn_latency_${tag}_$gpu
        bench --engine final --workload prefill --workload-arg lengths=512,2048,8192 --workload-arg per_length=5 \
          "${attn[@]}" --name attn_prefill_${tag}_$gpu
        # What $OUT holds comes back even from a call cut off at its time limit: keep each pair's.
        keep_partial attn
      done
      $py -m scripts.results_attention $results
      ;;
    test-stage05) OUT=$out bash scripts/run_gpu_tests.sh tests/stages/test_stage05_gpu.py ;;
    bench-stage05)
      for b in 1 8 64 256; do
        bench --engine stages.05_cuda_graph --workload decode-step --workload-arg batch=$b --engine-arg attn=fi --engine-arg page_size=16 --name stage05_decode_b${b}_graphs_$gpu
        bench --engine stages.05_cuda_graph --workload decode-step --workload-arg batch=$b --engine-arg attn=fi --engine-arg page_size=16 --engine-arg cuda_graph_max_bs=0 --name stage05_decode_b${b}_eager_$gpu
      done
      ;;
    bench-stage05-offline)
      bench --engine stages.05_cuda_graph --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name stage05_offline_graphs_$gpu
      bench --engine stages.05_cuda_graph --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg cuda_graph_max_bs=0 --name stage05_offline_eager_$gpu
      ;;
    profile-stage05)
      for b in 1 64; do
        $py -m scripts.profile_decode_step --model $ckpt --device cuda --dtype bfloat16 --attn fi --page-size 16 --batch $b --out benchmarks/profiles/$gpu
      done
      ;;
    bench-tp) bench_tp_grid final "${TP_PREFIX:-final}" ;;  # TP_PREFIX names an A/B arm (FINAL_PREFILL_GRAPHS=...)
    bench-tp-one-shot) FINAL_CUSTOM_ALL_REDUCE=1 bench_tp_grid final final_oneshot ;;
    test-stage06) OUT=$out bash scripts/run_gpu_tests.sh tests/stages/test_stage06_gpu.py ;;
    bench-stage06)
      bench --engine stages.06_overlap --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name stage06_offline_overlap_$gpu
      bench --engine stages.06_overlap --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg disable_overlap=1 --name stage06_offline_serial_$gpu
      ;;
    bench-stage06-online)
      bench --engine stages.06_overlap --workload online --workload-arg rate=16 --engine-arg attn=fi --engine-arg page_size=16 --name stage06_online_overlap_$gpu
      bench --engine stages.06_overlap --workload online --workload-arg rate=16 --engine-arg attn=fi --engine-arg page_size=16 --engine-arg disable_overlap=1 --name stage06_online_serial_$gpu
      ;;
    profile-stage06)
      $py -m scripts.profile_decode_step --stage 06_overlap --steps 8 --model $ckpt --device cuda --dtype bfloat16 --attn fi --page-size 16 --batch 64 --out benchmarks/profiles/$gpu
      ;;
    profile-final)
      for b in 1 64; do
        $py -m scripts.profile_decode_step --stage final --steps 8 --model $ckpt --device cuda --dtype bfloat16 --attn fi --page-size 16 --batch $b --out benchmarks/profiles/$gpu || return 1
      done
      ;;
    test-stage07) OUT=$out bash scripts/run_gpu_tests.sh tests/stages/test_stage07_gpu.py ;;
    bench-stage07) bench_tp_grid stages.07_tensor_parallel stage07 --engine-arg page_size=16 ;;
    peers)  # with bench-final in the same call: the Performance page pairs them by run id
      for w in offline latency; do
        PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py -m scripts.bench_peer --engine mini-sglang --workload $w --model $ckpt --out $results --name peer_minisgl_${w}_$gpu
      done
      ;;
    bench-final-online)
      $py -m scripts.bench_server_online --engine final --model $ckpt --out-dir $results \
        --name final_online_$gpu --rates "${ONLINE_RATES:-8,32,64,inf}" --port 19190
      ;;
    peers-online)  # with bench-final-online in the same call, at the same rates
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py -m scripts.bench_server_online --engine mini-sglang \
        --model $ckpt --out-dir $results --name peer_minisgl_online_$gpu --rates "${ONLINE_RATES:-8,32,64,inf}" --port 19290
      ;;
    online-policy)
      local rates=${ONLINE_RATES:-8,32,64,inf} n=${ONLINE_REQUESTS:-256} status=0
      online() {  # NAME ENGINE [ARGS...]: one server, every rate; its results kept at once
        local name=$1 engine=$2 trace=$out/logs/steps_$1.jsonl
        shift 2
        # final/'s engine writes its step trace (final/runtime/step_trace.py; Mini-SGLang ignores
        # the variable), and the report says what each rate's bursts came after.
        FINAL_STEP_TRACE=$trace $py -m scripts.bench_server_online --engine "$engine" --model $ckpt \
          --out-dir $results --name "$name" --rates "$rates" --num-requests "$n" \
          --server-log "$out/logs/server_$name.log" "$@" || status=1
        if [ -s "$trace" ]; then
          $py -m scripts.step_trace_report "$trace" --labels "$rates" --json "$out/logs/bursts_$name.json" || true
          gzip -f "$trace"
        fi
        keep_partial online
        return 0
      }
      # final/ as served: --attn auto (Hopper: FlashAttention 4's prefill, FlashInfer's decode)
      # unless ONLINE_FINAL_ATTN names one; Mini-SGLang with FlashInfer, its FA3 kernel not on the host.
      # ONLINE_SERVERS (default "mixed prefill-first minisgl"): which run, e.g. "mixed" alone for a
      # reading of final/'s server by itself (not a pair: the page pairs by run id); "catch-up" adds
      # final/ with --stream-catch-up-ms ${ONLINE_CATCH_UP_MS:-50} (off by default) to the call.
      local attn=${ONLINE_FINAL_ATTN:-auto} servers=" ${ONLINE_SERVERS:-mixed prefill-first minisgl} "
      [[ $servers == *" mixed "* ]] && online final_online_$gpu final --port 19190 --final-args "--attn $attn"
      [[ $servers == *" prefill-first "* ]] && online final_online_prefill_first_$gpu final --port 19191 \
        --final-args "--attn $attn --chunk-policy prefill-first"
      [[ $servers == *" catch-up "* ]] && online final_online_catch_up_ms${ONLINE_CATCH_UP_MS:-50}_$gpu final --port 19192 \
        --final-args "--attn $attn --stream-catch-up-ms ${ONLINE_CATCH_UP_MS:-50}"
      [[ $servers == *" minisgl "* ]] && PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH online peer_minisgl_online_$gpu \
        mini-sglang --port 19290
      return $status
      ;;
    bench-stage01)
      bench --engine stages.01_naive_generate --workload latency --repeats 3 --name stage01_latency_$gpu
      bench --engine hf --workload latency --repeats 3 --name stage01_latency_hf_$gpu
      ;;
    bench-stage02)
      bench --engine stages.02_paged_kv --workload latency --engine-arg attn=fi --repeats 3 --name stage02_latency_fi_$gpu
      bench --engine stages.02_paged_kv --workload offline --engine-arg attn=fi --name stage02_offline_fi_$gpu
      bench --engine stages.02_paged_kv --workload offline --scale 0.25 --engine-arg attn=fi --name stage02_offline_fi_s025_$gpu
      bench --engine stages.02_paged_kv --workload offline --scale 0.25 --engine-arg attn=torch --name stage02_offline_torch_s025_$gpu
      ;;
    bench-stage03)
      for w in shared-prefix no-sharing; do
        for cache in radix naive; do
          bench --engine stages.03_radix_cache --workload $w --engine-arg attn=fi --engine-arg page_size=16 \
            --engine-arg cache=$cache --name stage03_${w//-/_}_${cache}_$gpu
        done
      done
      ;;
    bench-ch04)
      # CH04_ONLY="mixed_8192 prefill_first_8192": only those configurations (what a GPU still lacks).
      ch04() {  # CONFIG ARGS...
        local config=$1
        shift
        case " ${CH04_ONLY:-$config} " in *" $config "*) ;; *) return 0 ;; esac
        bench --engine stages.04_chunked_prefill --workload long-prompt --repeats 3 --engine-arg attn=fi \
          --engine-arg page_size=16 "$@" --name stage04_long_prompt_${config}_$gpu
        keep_partial ch04
      }
      ch04 mixed_2048 --engine-arg max_prefill_length=2048 --engine-arg chunk_policy=mixed
      ch04 mixed_8192 --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=mixed
      ch04 prefill_first_8192 --engine-arg max_prefill_length=8192 --engine-arg chunk_policy=prefill-first
      ch04 unchunked --engine-arg max_prefill_length=65536 --engine-arg chunk_policy=prefill-first
      ;;
    profile-ch01)
      for engine in stages.01_naive_generate hf; do
        tag=$([ $engine = hf ] && echo hf_ || true)
        $py -m scripts.profile_decode --engine $engine --device cuda --dtype bfloat16 --model $ckpt --out $results --name stage01_profile_${tag}$gpu
      done
      ;;
    ladder)
      bench --engine stages.01_naive_generate --workload offline --max-requests 16 --name ladder_stage01_$gpu
      for dir in stages/0[2-9]_*/; do
        stage=$(basename "$dir")
        bench --engine stages.$stage --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name ladder_stage${stage:0:2}_$gpu
      done
      bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --name ladder_final_$gpu
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py -m scripts.bench_peer --engine mini-sglang --model $ckpt --out $results --name ladder_minisgl_$gpu
      PYTHONPATH=$PWD/.peers/nanovllm:$PYTHONPATH $py -m scripts.bench_peer --engine nano-vllm --model $ckpt --out $results --name ladder_nanovllm_$gpu \
        || echo "Nano-vLLM did not run (it needs FlashAttention 2): its ladder row stays empty"
      ;;
    bench-policy)
      for policy in mixed prefill-first; do
        bench --engine final --workload offline --engine-arg attn=fi --engine-arg page_size=16 --engine-arg chunk_policy=$policy --name final_offline_policy_${policy//-/_}_$gpu
      done
      ;;
    versus)
      # VERSUS_BASE=<folder with an older final/> (e.g. .base: git archive <commit> final | tar -x -C .base)
      # measures that final/ too, in the same call: what the change since then bought.
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py -m scripts.bench_versus --model $ckpt --out $results \
        --gpu $gpu --repeats "${VERSUS_REPEATS:-3}" ${VERSUS_BASE:+--base "$VERSUS_BASE"} \
        ${VERSUS_FINAL_ATTN:+--final-attn "$VERSUS_FINAL_ATTN"}
      ;;
    gc-freeze) $py -m scripts.bench_gc_freeze --model $ckpt --out-dir $results ;;
    api-cost) $py -m scripts.bench_api_cost --model $ckpt --tick-ms 5 --out-dir $results --name final_api_cost_$gpu ;;
    host-step) $py -m scripts.bench_host_step --steps 200 --json "$out/logs/host_step.json" ;;
    graph-launch) $py -m scripts.bench_graph_launch --model $ckpt --batch 1 64 --out-dir $results ;;
    offline-phases) $py -m scripts.bench_offline_phases --model $ckpt --out-dir $results ;;
    prefill-host)  # the host's share of a batch-1 prefill per backend (issue 26), into logs/ and results (needs the fa kit for fa)
      # PREFILL_HOST_PROFILE=1: each length's top Python calls too; PREFILL_HOST_BREAKDOWN=1: its launch
      # split into parts by plain clock reads (no profiler); PREFILL_HOST_NAME: the JSON's name;
      # PREFILL_HOST_BATCH=32 PREFILL_HOST_TOKENS=512: an offline workload's prefill step
      $py -m scripts.bench_prefill_host --model $ckpt --attn ${ATTN_SPECS:-fi fa} --out-dir "$out/logs" --results-dir $results \
        --name "${PREFILL_HOST_NAME:-prefill_host}" ${PREFILL_HOST_PROFILE:+--profile} ${PREFILL_HOST_BREAKDOWN:+--breakdown} \
        --batch "${PREFILL_HOST_BATCH:-1}" --tokens ${PREFILL_HOST_TOKENS:-512 2048 8192} ;;
    pdl-ab)  # the batch-1 step with programmatic dependent launch (final/kernels/gemv.py) and without, one call
      for pdl in 1 0; do
        FINAL_PDL=$pdl bench --engine final --workload latency --repeats 3 --engine-arg attn=fi \
          --name final_latency_pdl${pdl}_$gpu
      done
      # where the fused K/V kernel's PDL stops paying (qk_norm_rope_kv.PDL_MAX_TOKENS): kernel tables
      local variant
      for variant in FINAL_PDL=0:off FINAL_PDL=1:shipped FINAL_PDL_MAX_TOKENS=100000:all; do
        env "${variant%%:*}" $py -m scripts.kernel_table --engine final --model $ckpt --attn fi \
          --batch 1 64 256 --temperature 0.0 --json "$out/logs/pdl_kernels_${variant##*:}.json"
      done
      $py -m scripts.results_pdl "$out/logs" ;;  # per batch: busy and fused-kernel time, the bound
    latency-trees)  # the batch-1 step of several versions of final/ in one call, to find when it moved:
      # each folder of LATENCY_TREES (default .latency-trees/*, scripts/export_trees.sh) holds a final/;
      # LATENCY_ROUNDS rounds (default 3), the trees alternating within each, one fresh process a run
      # (bench_peer.py --final-path: versus's latency workload, --attn auto), then each tree's median
      # into final_latency_trees_<gpu>.json (scripts/latency_trees.py)
      local round tree trees=(${LATENCY_TREES:-.latency-trees/*})
      mkdir -p "$out/logs/latency-trees"
      for round in $(seq "${LATENCY_ROUNDS:-3}"); do
        for tree in "${trees[@]}"; do
          $py -m scripts.bench_peer --engine final --workload latency --model $ckpt --attn auto \
            --final-path "$tree" --out "$out/logs/latency-trees" --name "$(basename "$tree")_r$round"
        done
      done
      $py -m scripts.latency_trees "$out/logs/latency-trees" --out "$results" --gpu "$gpu"
      ;;
    tc-ab)  # TC_ARMS: batch:context[:spread] (FINAL_TC_MIN_BATCH, FINAL_TC_MIN_CONTEXT, FINAL_TC_MIN_SPREAD;
      # a context of 0: any; a spread in percent, none or 0: off), e.g. "64:768 64:768:25"
      local arm batch context spread
      for arm in ${TC_ARMS:-0:0 64:0 64:1024 64:768}; do
        IFS=: read -r batch context spread <<< "$arm"
        spread=${spread:-0}
        FINAL_TC_MIN_BATCH=$batch FINAL_TC_MIN_CONTEXT=$context FINAL_TC_MIN_SPREAD=$spread \
          bench --engine final --workload offline --repeats 2 --engine-arg page_size=16 \
          --name final_offline_tc${batch}$( [ "$context" = 0 ] || echo _ctx$context )$( [ "$spread" = 0 ] || echo _spread$spread )_$gpu
      done ;;
    pdl-bound)  # PDL_BATCHES: the batches to time (a pair of arms each, about 100 s a batch)
      local b step
      for b in ${PDL_BATCHES:-1 2 4}; do
        step=(--engine final --workload decode-step --workload-arg batch=$b --repeats 3 --engine-arg attn=fi --engine-arg page_size=16)
        FINAL_PDL_MAX_TOKENS=256 bench "${step[@]}" --name final_decode_b${b}_pdl_on_$gpu
        FINAL_PDL_MAX_TOKENS=0 bench "${step[@]}" --name final_decode_b${b}_pdl_off_$gpu
      done ;;
    prefill-kernels)  # both engines' kernels of one 16,384-token prefill (issue 31), into logs/
      $py -m scripts.kernel_table --engine final --model $ckpt --batch --prefill-prompts 32 --json "$out/logs/prefill_kernels_final.json"
      PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH $py -m scripts.kernel_table --engine mini-sglang --model $ckpt \
        --batch --prefill-prompts 32 --json "$out/logs/prefill_kernels_minisgl.json" ;;
    test-kv-fp8) OUT=$out bash scripts/run_gpu_tests.sh tests/final/kvcache/test_final_gpu_kv_fp8.py ;;
    kv-fp8)
      local part rc=0
      for part in kv-fp8-accuracy kv-fp8-capacity kv-fp8-kernel kv-fp8-speed; do
        echo "--- $part $(date +%T)"
        run_step $part || rc=$?
        keep_partial kv-fp8
      done
      return $rc
      ;;
    kv-fp8-accuracy)
      local rc=0
      $py -m scripts.kv_fp8_accuracy --device cuda --attn fi --model $ckpt --model-tag qwen306b --out $results --no-progress || rc=$?
      $py -m scripts.kv_fp8_accuracy --device cuda --attn fi --model-tag smollm2 --out $results --no-progress || rc=$?
      return $rc
      ;;
    kv-fp8-capacity)
      $py -m scripts.kv_fp8_capacity --model $ckpt --device cuda --dtype bfloat16 --attn fi --page-size 16 \
        --memory-ratio 0.9 --device-tag $gpu --out $results
      ;;
    kv-fp8-kernel) $py -m scripts.bench_kv_fp8_decode --out $results/kv_fp8_decode_kernel_$gpu.json ;;
    kv-fp8-speed)
      local kv tag small=${KV_FP8_SMALL_RATIO:-$([ "$gpu" = h100 ] && echo 0.53 || echo 0.32)}
      for kv in bf16 fp8_e4m3; do
        tag=${kv%%_*}
        local args=(--engine-arg attn=fi --engine-arg page_size=16 --engine-arg kv_cache_dtype=$kv)
        bench --engine final --workload offline "${args[@]}" --name kv_offline_${tag}_$gpu
        bench --engine final --workload latency "${args[@]}" --engine-arg cuda_graph_max_bs=8 --name kv_latency_${tag}_$gpu
        bench --engine final --workload long-context "${args[@]}" --engine-arg cuda_graph_max_bs=64 \
          --name kv_long_context_${tag}_$gpu
        bench --engine final --workload long-context "${args[@]}" --engine-arg cuda_graph_max_bs=64 \
          --engine-arg memory_ratio=$small --name kv_long_context_small_${tag}_$gpu
      done
      ;;
    kv-fp8-bound)  # a workload whose batch the KV cache limits: FP8's room as throughput (issue 32)
      local kv tag small=${KV_FP8_SMALL_RATIO:-$([ "$gpu" = h100 ] && echo 0.53 || echo 0.32)}
      for kv in bf16 fp8_e4m3; do
        tag=${kv%%_*}
        bench --engine final --workload long-context --engine-arg attn=fi --engine-arg page_size=16 \
          --engine-arg kv_cache_dtype=$kv --engine-arg memory_ratio=$small --engine-arg cuda_graph_max_bs=256 \
          --workload-arg num_requests=256 --workload-arg min_len=2048 --workload-arg max_len=4096 \
          --workload-arg output_len=512 --name kv_capacity_bound_${tag}_$gpu
      done
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
[ -d "benchmarks/profiles/$gpu" ] && tar -rf "$out/results.tar" "benchmarks/profiles/$gpu"
exit $status
