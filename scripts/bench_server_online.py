"""The online benchmark against a server we start: final/'s or Mini-SGLang's, on loopback.

    python -m scripts.bench_server_online --engine final --model CKPT --out-dir benchmarks/results/h200 \
        --name final_online_h200 --rates 8,32,64,inf [--final-args "--chunk-policy prefill-first"]
    PYTHONPATH=$PWD/.peers/minisgl:$PYTHONPATH python -m scripts.bench_server_online \
        --engine mini-sglang --model CKPT --out-dir benchmarks/results/h200 --name peer_minisgl_online_h200

Starts the engine's OpenAI-compatible server in a process group of its own, polls its
/v1/models (both serve it, and Mini-SGLang only once its scheduler and tokenizer are up) until it
answers or --ready-timeout passes, runs scripts/bench_online.py at the given rates (results
`<name>_rate<R>.json`, with $BENCH_RUN_ID as their run_id), and stops the whole group however the
run ends. Settings as in the offline comparison (scripts/bench_peer.py): FlashInfer attention,
bfloat16, graphs on; final/ with page size 16, Mini-SGLang with its FlashInfer page size 1, CUDA
graphs up to batch 256, 4096-token sequences, 16384-token prefill chunks.

Mini-SGLang's server takes only text prompts on /v1/chat/completions (`prompt`: no chat
template), so both engines are sent the same text prompts (`--prompt-text`), each of exactly the
workload's token count under the checkpoint's tokenizer: the two rows of one rate serve the same
tokens.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (see bench_online.py)
    import httpx2 as httpx  # type: ignore[no-redef]

ENGINES = ("final", "mini-sglang")
APIS = {"final": "completions", "mini-sglang": "chat"}


def server_command(
    engine: str, model: Path, port: int, python: str = sys.executable, final_args: str = ""
) -> list[str]:
    """The command that serves `model` on 127.0.0.1:`port` with the comparison's settings;
    `final_args`, more flags of final/'s (e.g. "--chunk-policy prefill-first"), after them."""
    if engine == "final":
        return [
            python, "-m", "final", "--model", str(model), "--device", "cuda", "--attn", "fi",
            "--page-size", "16", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            *shlex.split(final_args),
        ]  # fmt: skip
    if final_args:
        raise ValueError("--final-args is for --engine final")
    if engine == "mini-sglang":
        # bench_peer.py's LLM(...) settings, as server flags (minisgl/server/args.py).
        return [
            python, "-m", "minisgl", "--model-path", str(model), "--dtype", "bfloat16",
            "--attention-backend", "fi", "--page-size", "1", "--cuda-graph-max-bs", "256",
            "--max-seq-len-override", "4096", "--max-prefill-length", "16384",
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
    raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def bench_command(args: argparse.Namespace, url: str, python: str = sys.executable) -> list[str]:
    return [
        python, "-m", "scripts.bench_online", "--url", url, "--rates", args.rates,
        "--scale", str(args.scale), "--out-dir", str(args.out_dir), "--name", args.name,
        "--stage", args.engine, "--api", APIS[args.engine], "--prompt-text", str(args.model),
        *(["--timing"] if args.engine == "final" else []),  # final/'s per-chunk engine timestamps
        *(["--num-requests", str(args.num_requests)] if args.num_requests else []),
        *(["--server-args", args.final_args] if args.final_args else []),
    ]  # fmt: skip


class ServerDied(RuntimeError):
    pass


def wait_ready(url: str, server: subprocess.Popen, timeout_s: float, poll_s: float = 1.0) -> float:
    """Poll `url`/v1/models until it answers 200; the seconds it took. Raises ServerDied if the
    server exits first and TimeoutError after `timeout_s` (model load and FlashInfer's first
    compiles take minutes on a fresh machine)."""
    start = time.monotonic()
    while True:
        if server.poll() is not None:
            raise ServerDied(f"the server exited with code {server.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"the server did not answer {url}/v1/models within {timeout_s:g} s")
        time.sleep(poll_s)  # the poll interval, not a synchronisation: readiness is the answer above


def stop(server: subprocess.Popen, grace_s: float = 30.0) -> None:
    """End the server's whole process group (Mini-SGLang's scheduler and tokenizer processes
    too): SIGTERM, then SIGKILL if it is still there after `grace_s`."""
    if server.poll() is None:
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            server.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # children may outlive the leader: clear the group in any case
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True, choices=ENGINES)
    p.add_argument("--model", type=Path, required=True, help="the HF folder both engines load")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--name", required=True, help="result name prefix, e.g. peer_minisgl_online_h200")
    p.add_argument("--rates", default="8,32,64,inf")
    p.add_argument("--num-requests", type=int, default=None, help="requests per rate (default: 256 x scale)")
    p.add_argument(
        "--final-args", default="",
        help='more flags for final/\'s server, e.g. "--chunk-policy prefill-first" (recorded in the results)',
    )  # fmt: skip
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--port", type=int, default=19190)
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the server")
    p.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="keep the server's output here (else a temporary file, whose end is printed if it dies)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None, command: list[str] | None = None) -> int:
    """`command` replaces the server's command (the tests start a stand-in)."""
    args = parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    if args.final_args and args.engine != "final":
        print("[bench_server_online] --final-args is for --engine final", file=sys.stderr)
        return 2
    cmd = command or server_command(args.engine, args.model, args.port, final_args=args.final_args)
    print(f"[bench_server_online] {' '.join(cmd)}", file=sys.stderr, flush=True)
    if args.server_log:
        args.server_log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.server_log, "w+") if args.server_log else tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                took = wait_ready(url, server, args.ready_timeout)
            except (ServerDied, TimeoutError) as err:
                print_tail(log)
                print(f"[bench_server_online] {args.engine}: {err}", file=sys.stderr)
                return 1
            print(f"[bench_server_online] {args.engine} ready in {took:.0f} s", file=sys.stderr, flush=True)
            code = subprocess.run(bench_command(args, url)).returncode
            if server.poll() is not None:  # it died under load: what it said last is the why
                print_tail(log)
                print(
                    f"[bench_server_online] {args.engine} exited ({server.returncode}) during the run",
                    file=sys.stderr,
                )
                return code or 1
            return code
        finally:
            stop(server)


def print_tail(log, chars: int = 20000) -> None:
    log.flush()
    log.seek(0)
    sys.stderr.write(log.read()[-chars:])


if __name__ == "__main__":
    sys.exit(main())
