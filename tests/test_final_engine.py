"""final/ without a server: its package layout, the offline LLM, the scheduler's page accounting,
the feature registries and their clear "not yet" errors, and the command line."""

from __future__ import annotations

import ast
import logging
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import final
from final import attention
from final.__main__ import main as final_main
from final.args import build_parser, parse_args
from final.attention import support
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.frontend.detokenizer import IncrementalDetokenizer, TextStream
from final.frontend.tokenizer import Tokenizer
from final.kvcache import KVCacheManager, PageTable, create_prefix_cache
from final.scheduler.request import Request
from final.scheduler.scheduler import Scheduler
from tests.fixtures.tiny_models import hf_greedy, sample_prompts

ROOT = Path(__file__).resolve().parents[1]
FINAL = ROOT / "final"

# ---------------------------------------------------------------------------------------------
# Layout: imports flow one way, server -> ... -> core, and there are no cycles.

# A package may import only from packages of a lower rank (or from itself).
RANKS = {
    "core": 0,
    "distributed": 1,
    "kvcache": 1,
    "models": 2,
    "attention": 2,
    "scheduler": 3,
    "engine": 4,
    "frontend": 5,
    "server": 6,
    "shell": 6,
    "": 7,  # top-level modules (llm.py, args.py, __main__.py)
}


def final_modules() -> dict[str, Path]:
    out = {}
    for path in FINAL.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of final/ that `module` imports (relative imports resolved), at any depth of the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS) else ""


def test_every_final_package_has_a_rank():
    packages = {p.name for p in FINAL.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(RANKS), f"give these packages a rank in RANKS: {packages - set(RANKS)}"


def test_imports_flow_one_way():
    modules = final_modules()
    bad = []
    for module, path in modules.items():
        src = layer_of(module)
        for target in imports_of(module, path, set(modules)):
            dst = layer_of(target)
            if target == "final" or (dst != src and RANKS[dst] >= RANKS[src]):
                bad.append(f"{module} ({src or 'top'}) imports {target} ({dst or 'top'})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycles():
    modules = final_modules()
    graph = {m: imports_of(m, p, set(modules)) for m, p in modules.items()}
    # A package's __init__ importing its own modules is how packages work, not a cycle.
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_layering_check_catches_a_violation(tmp_path):
    """The checker must be able to fail: a core module importing the server."""
    fake = tmp_path / "final" / "core"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from ..server import app\nfrom final.scheduler import x\n")
    known = {"final.server", "final.server.app", "final.scheduler", "final.core", "final.core.bad"}
    found = imports_of("final.core.bad", fake / "bad.py", known)
    assert found == {"final.server", "final.server.app", "final.scheduler"}
    assert all(RANKS[layer_of(t)] > RANKS["core"] for t in found)


# ---------------------------------------------------------------------------------------------
# The offline LLM

_llms: dict[tuple, final.LLM] = {}


def make_llm(model_dir: Path, **kwargs) -> final.LLM:
    key = (str(model_dir), tuple(sorted(kwargs.items())))
    if key not in _llms:
        _llms[key] = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    return _llms[key]


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_pool_is_whole(llm: final.LLM) -> None:
    """Idle: every page is free or cached and unlocked (so evictable), and the integrity check passes."""
    core = llm.core
    assert not core.has_work()
    cache = core.kv.prefix_cache
    assert core.kv.num_free_pages + cache.evictable_pages == core.kv.num_pages, "KV pages leaked"
    assert cache.num_cached_pages == cache.evictable_pages, "a finished request left a lock behind"
    assert core.runner.page_table.num_free_rows == llm.engine_config.max_running_requests
    core.check_integrity()


def test_public_api_matches_the_stages(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    assert llm.config.vocab_size > 0
    out = llm.generate(["The cat reads"], greedy(5))[0]
    assert isinstance(out, final.RequestOutput)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.text == llm.tokenizer.decode(out.token_ids)
    assert len(out.token_times) == 5 and out.token_times == sorted(out.token_times)
    assert 0 < out.ttft_s <= out.latency_s
    assert out.cached_tokens == 0  # nothing cached yet starts with this prompt's first token
    again = llm.generate(["The cat reads"], greedy(5))[0]
    assert again.token_ids == out.token_ids
    assert again.cached_tokens == len(out.prompt_ids) - 1  # a full hit still computes the last token


def test_sampling_params_are_duck_typed(tiny_qwen3_dir):
    """The conformance suite passes stages.common's SamplingParams; any object with the fields works."""
    llm = make_llm(tiny_qwen3_dir)
    prompt = sample_prompts(tiny_qwen3_dir, n=1, seed=4)[0]
    ours = llm.generate([prompt], greedy(6))[0].token_ids
    foreign = SimpleNamespace(**vars(greedy(6)))
    assert llm.generate([prompt], foreign)[0].token_ids == ours
    with pytest.raises(UserError, match="temperature"):
        llm.add_request(prompt, SimpleNamespace(temperature=-1.0))


def test_stop_string_spanning_tokens_cuts_the_text_and_frees_pages(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=5)[1]
    free = llm.generate([prompt], greedy(24))[0]
    pieces = [llm.tokenizer.decode([t]) for t in free.token_ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(
        i
        for i in range(3, len(pieces) - 1)
        if pieces[i] and pieces[i + 1] and "\ufffd" not in pieces[i] + pieces[i + 1]
    )
    stop = pieces[k][-1] + pieces[k + 1][0]
    cut = free.text.find(stop)
    out = llm.generate([prompt], greedy(24, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == free.text[:cut]
    assert out.token_ids == free.token_ids[: len(out.token_ids)] and len(out.token_ids) < 24
    assert_pool_is_whole(llm)  # the engine was told to drop the request when the stop string hit


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=6)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate([prompts[0]], seeded)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batched = llm.generate(prompts, [seeded, other, other, other])[0].token_ids
    assert alone == batched
    different = llm.generate(
        [prompts[0]], SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    )
    assert different[0].token_ids != alone


def test_preemption_gives_the_same_tokens_and_leaks_nothing(tiny_llama_dir):
    prompts = sample_prompts(tiny_llama_dir, n=5, seed=7)
    expected = hf_greedy(tiny_llama_dir, prompts, 24)
    tight = make_llm(tiny_llama_dir, page_size=4, num_pages=40, max_running_requests=4)
    outs = tight.generate(prompts, greedy(24))
    assert [o.token_ids for o in outs] == expected
    assert tight.core.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    assert_pool_is_whole(tight)


def test_too_big_requests_are_refused_with_the_limits(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir, page_size=4, num_pages=40, max_running_requests=4)
    with pytest.raises(UserError, match="context holds 256"):
        llm.add_request(list(range(1, 300)), greedy(4))
    with pytest.raises(UserError, match="pool holds 160"):
        llm.add_request(list(range(1, 100)), greedy(200))
    with pytest.raises(UserError, match="empty"):
        llm.add_request([], greedy(4))
    assert_pool_is_whole(llm)


def test_abort_frees_pages_of_running_and_waiting_requests(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir, max_running_requests=2)
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=8)
    rids = [llm.add_request(p, greedy(50)) for p in prompts]
    llm.step()
    llm.step()
    assert llm.core.scheduler.num_running == 2 and llm.core.scheduler.num_waiting == 2
    assert llm.core.kv.num_free_pages < llm.core.kv.num_pages
    for rid in rids:
        assert llm.core.abort(rid)
        llm.requests.pop(rid)
    assert not llm.core.abort(rids[0])  # gone already
    assert_pool_is_whole(llm)


def test_merged_projections_hold_the_checkpoint_weights(tiny_qwen3_dir):
    """q/k/v and gate/up are merged at load time: check the slices, not only the outputs."""
    layer = make_llm(tiny_qwen3_dir).core.runner.model.model.layers[1]
    with safe_open(str(tiny_qwen3_dir / "model.safetensors"), framework="pt") as f:
        w = {n: f.get_tensor(n) for n in f.keys() if n.startswith("model.layers.1.")}
    qkv = torch.cat([w[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([w[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight, gate_up, rtol=0, atol=0)


def test_logits_only_for_each_requests_last_token(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    seen: list[tuple[int, ...]] = []
    head = llm.core.runner.model.lm_head
    handle = head.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        llm.generate(sample_prompts(tiny_qwen3_dir, n=3, seed=9)[1:], greedy(2))
    finally:
        handle.remove()
    assert seen[0][0] == 2, f"the LM head ran on {seen[0][0]} rows for a prefill of 2 requests"


# ---------------------------------------------------------------------------------------------
# Bad options: one clear error each


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"attn": "nope"}, "choose from torch, fi, fa, trtllm"),
        ({"attn": "fi"}, "CUDA"),
        ({"cache": "lru"}, "choose from radix, naive"),
        ({"chunk_policy": "fifo"}, "--chunk-policy must be one of mixed, prefill-first"),
        ({"max_prefill_length": 0}, "--max-prefill-length"),
        ({"page_size": 0}, "--page-size"),
        ({"no_such_option": 1}, "unknown engine option"),
    ],
)
def test_bad_engine_options_are_user_errors(tiny_qwen3_dir, kwargs, needle):
    with pytest.raises(UserError, match=needle):
        final.LLM(str(tiny_qwen3_dir), device="cpu", **kwargs)


def test_cuda_graph_flag_on_the_cpu_logs_one_line(tiny_qwen3_dir, caplog):
    with caplog.at_level(logging.INFO, logger="final"):
        final.LLM(str(tiny_qwen3_dir), device="cpu", cuda_graph_max_bs=8)
    lines = [r.getMessage() for r in caplog.records if "cuda-graph" in r.getMessage()]
    assert lines == ["--cuda-graph-max-bs 8 ignored on the CPU: CUDA graphs need a GPU"]


# ---------------------------------------------------------------------------------------------
# Scheduler and cache manager: pages never leak or get shared, whatever arrives and leaves


@settings(max_examples=60, deadline=None)
@given(
    cache=st.sampled_from(["radix", "naive"]),
    policy=st.sampled_from(["mixed", "prefill-first"]),
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(min_value=16, max_value=60),
    max_running=st.integers(min_value=1, max_value=5),
    budget=st.sampled_from([1, 3, 8, 64, 10_000]),
    requests=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 24), st.integers(1, 16), st.booleans()),
        min_size=1,
        max_size=10,
    ),
)
def test_scheduler_never_leaks_or_shares_pages(
    cache, policy, page_size, num_pages, max_running, budget, requests
):
    """Heavy sharing (prompts start with one of three heads), chunking, eviction, preemption and
    aborts (some mid-prefill): after every step each page is free, cached or owned exactly once."""
    table = PageTable(max_running, 64, torch.device("cpu"), padding_page=num_pages)
    kv = KVCacheManager(num_pages, page_size, create_prefix_cache(cache, page_size), table)
    sched = Scheduler(kv, max_running, budget, policy)
    heads = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 20], [30 + i for i in range(12)]]
    live = []
    for rid, (head, prompt_len, max_new, abort_early) in enumerate(requests):
        prompt = (heads[head] + [rid + 100] * prompt_len)[: max(prompt_len, 1)]
        if len(prompt) + max_new <= num_pages * page_size:
            sched.add(Request(rid=rid, prompt_ids=prompt, params=SamplingParams(), max_new_tokens=max_new))
            live.append((rid, abort_early))
    aborted = {rid for rid, early in live if early}
    steps = 0
    while sched.has_work():
        decoding_before = {id(r) for r in sched.running if r.is_decoding}
        batch = sched.schedule()
        assert batch is not None
        prefill_tokens = sum(
            q for r, q in zip(batch.requests, batch.query_lens, strict=True) if id(r) not in decoding_before
        )
        assert prefill_tokens <= budget, "a step went over the prefill budget"
        if policy == "prefill-first" and prefill_tokens:
            assert all(id(r) not in decoding_before for r in batch.requests), "decodes ran with prefill"
        owned = [p for r in sched.running for p in r.kv.own_pages]
        assert len(owned) == len(set(owned)), "a page is owned by two live requests"
        sched.check_integrity()
        table.flush()
        for r in sched.running:
            assert table.table[r.kv.row, : len(r.kv.pages)].tolist() == r.kv.pages
        for req, q_len, sampled in zip(batch.requests, batch.query_lens, batch.sampled, strict=True):
            if not sampled:
                assert req.num_computed + q_len < req.seq_len, "only a cut prompt samples nothing"
                req.num_computed += q_len
                continue
            completes_prefill = q_len > 1 or not req.output_ids
            req.num_computed += q_len
            req.output_ids.append(7)
            if len(req.output_ids) >= req.max_new_tokens:
                sched.finish(req)
            elif completes_prefill:
                sched.cache_request(req)
        sched.check_integrity()
        for rid in list(aborted):
            if steps >= 2 and sched.abort(rid):
                aborted.discard(rid)
                sched.check_integrity()
        steps += 1
        assert steps < 10_000
    assert kv.num_free_pages + kv.prefix_cache.evictable_pages == num_pages
    assert kv.prefix_cache.num_cached_pages == kv.prefix_cache.evictable_pages
    assert table.num_free_rows == max_running


# ---------------------------------------------------------------------------------------------
# Detokenizer


def test_stream_never_splits_a_character_and_flushes_the_rest(tiny_tokenizer_dir):
    tok = Tokenizer(tiny_tokenizer_dir)
    ids = tok.encode("café 🙂 日本")
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == tok.decode(ids) and all("\ufffd" not in p for p in pieces)
    # A stream that ends inside a character still ends with everything decode() gives.
    emoji = tok.encode("🙂")
    stream = TextStream(tok)
    for i in emoji[:-1]:
        stream.push([i])
    assert stream.text == ""
    stream.finish()
    assert stream.text == tok.decode(emoji[:-1])


def test_stop_string_held_back_until_decided(tiny_tokenizer_dir):
    tok = Tokenizer(tiny_tokenizer_dir)
    stream = TextStream(tok, stop=["12345"])
    emitted = []
    for i in tok.encode("numbers 1234 and 12345 more"):
        text, hit = stream.push([i])
        emitted.append(text)
        if hit:
            break
    assert hit and "".join(emitted) == stream.text == "numbers 1234 and "


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_defaults():
    args = parse_args([])
    assert (args.model, args.host, args.port, args.cache, args.tp, args.shell) == (
        None, "127.0.0.1", 1919, "radix", 1, False,
    )  # fmt: skip
    assert (args.max_prefill_length, args.chunk_policy) == (8192, "mixed")
    config = EngineConfig()
    assert args.max_running_requests == config.max_running_requests
    assert args.max_prefill_length == config.max_prefill_length


def test_cli_help_explains_every_flag():
    text = build_parser().format_help()
    for flag in [
        "--model", "--host", "--port", "--dtype", "--device", "--attn", "--page-size", "--num-pages",
        "--memory-ratio", "--max-running-requests", "--max-prefill-length", "--chunk-policy", "--max-seq-len-override", "--cache",
        "--cuda-graph-max-bs", "--tp", "--shell", "--log-level",
    ]:  # fmt: skip
        assert flag in text, f"--help does not explain {flag}"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--attn", "flash"], "unknown attention backend 'flash'"),
        (["--shell", "--tp", "0"], "--tp must be >= 1"),
        (["--model", "/no/such/folder"], "not found"),
        (["--attn", "fi", "--device", "cpu"], "CUDA GPUs only"),
    ],
)
def test_cli_refuses_bad_flags_before_starting_anything(argv, needle):
    with pytest.raises(UserError, match=needle):
        final_main(argv)


@pytest.mark.parametrize(
    ("spec", "dtype", "expected"),
    [
        ("auto", torch.bfloat16, ("fi", "fi")),
        ("auto", None, ("fi", "fi")),  # dtype not known yet (--dtype auto is never float32 on CUDA)
        ("auto", torch.float32, ("torch", "torch")),  # FlashInfer has no float32 kernels
        ("fi,torch", torch.float16, ("fi", "torch")),
        ("fi", torch.float32, "needs --dtype bfloat16"),
        ("torch,fi", torch.float32, "needs --dtype bfloat16"),
    ],
)
def test_attention_choice_follows_device_and_dtype(monkeypatch, spec, dtype, expected):
    # FlashInfer installed, on a GPU whose auto choice is fi (tests/test_final_attention_backends.py
    # covers the other GPUs and libraries).
    monkeypatch.setattr(support, "installed", lambda module: module == "flashinfer")
    monkeypatch.setattr(
        support, "device_capability", lambda device: (8, 0) if str(device) == "cuda" else None
    )
    if isinstance(expected, str):
        with pytest.raises(UserError, match=expected):
            attention.resolve_names(spec, "cuda", dtype)
    else:
        assert attention.resolve_names(spec, "cuda", dtype) == expected
    assert attention.resolve_names("auto", "cpu", torch.bfloat16) == ("torch", "torch")


def test_cli_errors_are_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "final", "--attn", "trtllm"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --attn trtllm") and "Traceback" not in proc.stderr


def test_cli_refuses_a_busy_port_before_loading_the_model():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"127.0.0.1:{port}"):
            final_main(["--model", "/no/such/folder", "--port", str(port)])  # the port is checked first
