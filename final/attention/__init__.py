"""Attention backends behind one interface (base.py), each described by one descriptor
(registry.py, spec.py): `--attn NAME`, `--attn PREFILL,DECODE`, or `--attn auto`.

    spec.py, libraries.py   what a backend needs, as data (no torch: --help reads it)
    registry.py             the backends' descriptors; what `auto` may pick, by GPU
    support.py              the machine checked against a descriptor, one message per lack
    choose.py               `auto` and the page size resolved: an AttentionChoice
    factory.py              an AttentionChoice built into backends
    base.py, paged.py       the interface; the block table the paged kernels read
    torch_backend.py  flashinfer_backend.py  fa_backend.py  trtllm_backend.py
"""
