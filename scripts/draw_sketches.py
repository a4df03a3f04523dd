"""Draw two schematic figures of the book as plain SVG, written by hand so that every machine writes
the same bytes:

- docs/assets/graph_launches.svg (chapter 05): one decode step eager and replayed from a CUDA
  graph, the host's launches above and the GPU's kernels below (illustrative lengths; the
  measured step is the profile under chapter 05's "Measure it");
- docs/assets/tp_layer.svg (chapter 07): one step at TP=2, the two ranks side by side: what each
  rank holds and computes, the residual adds, and where the collectives join the ranks.

    python -m scripts.draw_sketches           # (re)write both
    python -m scripts.draw_sketches --check   # exit 1 if a committed file is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRAPH = Path("docs/assets/graph_launches.svg")
TP = Path("docs/assets/tp_layer.svg")
FONT = 'font-family="Helvetica, Arial, sans-serif"'
BLUE, PURPLE, ORANGE, GREEN, GREY, RED = "#3f6fb5", "#8e44ad", "#e67e22", "#27ae60", "#7f8c8d", "#f5d5d0"


def text(x: float, y: float, s: str, size: int = 11, anchor: str = "start", weight: str = "normal",
         fill: str = "#222") -> str:  # fmt: skip
    return (f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}">{s}</text>')  # fmt: skip


def box(x: float, y: float, w: float, h: float, fill: str, label: str = "", text_fill: str = "white",
        size: int = 11, dash: bool = False) -> list[str]:  # fmt: skip
    stroke = ' stroke="#555" stroke-dasharray="5,3" fill-opacity="0"' if dash else ' stroke="white"'
    out = [f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="3" fill="{fill}"{stroke} />']
    if label:
        out.append(text(x + w / 2, y + h / 2 + size * 0.35, label, size, "middle", fill=text_fill))
    return out


def svg(width: int, height: int, body: list[str]) -> str:
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555" /></marker></defs>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white" />',
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"


def arrow(x1: float, y1: float, x2: float, y2: float, dash: bool = False) -> str:
    extra = ' stroke-dasharray="4,3"' if dash else ""
    return (f'<path d="M {x1:.1f} {y1:.1f} L {x2:.1f} {y2:.1f}" stroke="#555" stroke-width="1.2" '
            f'fill="none" marker-end="url(#arrow)"{extra} />')  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Chapter 05: a step's launches, eager and replayed

LAUNCHES = 22  # drawn; a real step has well over a thousand
LEFT, LANE_H = 120.0, 26.0


def graph_launches() -> str:
    width = 900
    body = [
        text(20, 24, "One decode step: eager, then replayed from a CUDA graph", 13, weight="bold"),
        text(
            20,
            42,
            "(illustrative lengths: a real step has well over a thousand launches; "
            "the measured one is the profile under Measure it)",
            10,
            fill="#666",
        ),  # fmt: skip
    ]
    # Eager: each launch costs the host 30 px, the kernel it starts runs 9 px, then the GPU waits.
    y = 70
    body.append(
        text(20, y, "eager: the host launches every kernel; the GPU waits between them", 12, weight="bold")
    )
    launch_w, kernel_w = 30.0, 9.0
    end = LEFT + LAUNCHES * launch_w + 40
    for lane, top in (("host", y + 12), ("GPU", y + 46)):
        body.append(text(LEFT - 10, top + 17, lane, 11, "end", fill="#444"))
    body += box(LEFT, y + 46, end - LEFT, LANE_H, RED)
    for i in range(LAUNCHES):
        x = LEFT + i * launch_w
        body += box(x, y + 12, launch_w - 2, LANE_H, BLUE, "L" if i % 3 == 0 else "")
        body += box(x + launch_w - 4, y + 46, kernel_w, LANE_H, GREEN)
    body += box(LEFT + LAUNCHES * launch_w, y + 12, 40, LANE_H, ORANGE, "sync")
    body.append(text(end + 8, y + 29, "the step", 10, fill="#444"))
    body.append(arrow(LEFT, y + 84, end, y + 84))
    # Replayed: copy the inputs, plan attention, one graph launch; the kernels run back to back.
    y = 200
    body.append(text(20, y, "replayed: inputs copied, attention planned, one launch; the kernels back to back",
                     12, weight="bold"))  # fmt: skip
    for lane, top in (("host", y + 12), ("GPU", y + 46)):
        body.append(text(LEFT - 10, top + 17, lane, 11, "end", fill="#444"))
    x = LEFT
    for label, w, colour in (("copy inputs", 80, ORANGE), ("plan", 44, BLUE), ("G", 26, PURPLE)):
        body += box(x, y + 12, w - 2, LANE_H, colour, label)
        x += w
    start = x
    body += box(LEFT, y + 46, start - LEFT, LANE_H, RED)
    body += box(start, y + 46, LAUNCHES * kernel_w, LANE_H, GREEN, "kernels")
    sync_end = start + LAUNCHES * kernel_w + 10
    body += box(x, y + 12, sync_end - x, LANE_H, ORANGE, "sync")
    body.append(text(sync_end + 8, y + 29, "the step", 10, fill="#444"))
    body.append(arrow(LEFT, y + 84, sync_end, y + 84))
    legend = ((BLUE, "host: a launch (L), the plan"), (PURPLE, "host: the graph's one launch (G)"),
              (ORANGE, "host: copies, waiting for the GPU"), (GREEN, "GPU: a kernel"), (RED, "GPU: idle"))  # fmt: skip
    x = 20
    for colour, label in legend:
        body += box(x, 314, 12, 12, colour)
        body.append(text(x + 17, 324, label, 10, fill="#444"))
        x += 176
    return svg(width, 340, body)


# ---------------------------------------------------------------------------------------------
# Chapter 07: one step at TP=2, the ranks side by side

COL = (140.0, 460.0)  # the left edge of each rank's column
COL_W, ROW_H, GAP = 300.0, 26.0, 10.0
KIND = {
    "rep": (GREY, "white"),
    "shard": (BLUE, "white"),
    "coll": (ORANGE, "white"),
    "host": (PURPLE, "white"),
}
# (kind, rank 0's label, rank 1's label); a collective spans both columns; "" leaves a column empty.
ROWS: list[tuple[str, str, str]] = [
    ("host", "schedule; send the step (gloo, host)", "receive the step: the same batch"),
    ("shard", "embedding: vocabulary rows 0 to V/2", "embedding: rows V/2 to V"),
    ("coll", "all-reduce: every rank has every token's embedding", ""),
    ("rep", "RMSNorm (full hidden vector, on every rank)", "RMSNorm (the same)"),
    ("shard", "q, k, v of heads 0 to H/2 (column-parallel)", "q, k, v of heads H/2 to H"),
    ("shard", "q/k norm, RoPE: its own heads", "q/k norm, RoPE: its own heads"),
    ("shard", "attention: its heads, its KV cache", "attention: its heads, its KV cache"),
    ("shard", "o_proj: its input slice, a partial sum", "o_proj: its input slice, a partial sum"),
    ("coll", "all-reduce: the sum on every rank", ""),
    ("rep", "+ residual", "+ residual"),
    ("rep", "RMSNorm", "RMSNorm"),
    ("shard", "gate, up: its slice; silu(gate) · up", "gate, up: its slice; silu(gate) · up"),
    ("shard", "down_proj: its slice, a partial sum", "down_proj: its slice, a partial sum"),
    ("coll", "all-reduce: the sum on every rank", ""),
    ("rep", "+ residual", "+ residual"),
    ("shard", "LM head: its vocabulary rows, their logits", "LM head: its rows, their logits"),
    ("coll", "all-gather: every rank has all the logits", ""),
    ("host", "sample (rank 0 only)", ""),
    ("coll", "broadcast: the tokens into every rank's token table", ""),
]
LAYER = (3, 14)  # the rows of one decoder layer, framed and repeated L times
RESIDUALS = ((3, 9), (10, 14))  # (row whose input is added, row of the add)


def tp_layer() -> str:
    top = 84.0

    def y_of(row: int) -> float:
        return top + row * (ROW_H + GAP) + (14 if row >= LAYER[0] else 0) + (14 if row > LAYER[1] else 0)

    width, height = 800, int(y_of(len(ROWS)) + 56)
    body = [
        text(20, 24, "One decode step at TP=2: the ranks side by side", 13, weight="bold"),
        text(
            20,
            42,
            "(H query heads, V vocabulary rows; each rank holds half of every sharded matrix)",
            10,
            fill="#666",
        ),  # fmt: skip
    ]
    for x, name in zip(COL, ("rank 0 (GPU 0)", "rank 1 (GPU 1)"), strict=True):
        body.append(text(x + COL_W / 2, 68, name, 12, "middle", weight="bold"))
    first, last = y_of(LAYER[0]) - 10, y_of(LAYER[1]) + ROW_H + 10
    body += box(COL[0] - 40, first, COL[1] + COL_W - COL[0] + 56, last - first, "white", dash=True)
    body.append(text(COL[0] - 34, first + 14, "× L", 11, weight="bold", fill="#555"))
    body.append(text(20, (first + last) / 2, "each decoder", 10, fill="#555"))
    body.append(text(20, (first + last) / 2 + 13, "layer", 10, fill="#555"))
    for source, add in RESIDUALS:  # the residual path, drawn first: it passes behind the collectives
        for x in COL:
            left = x - 14
            y1, y2 = y_of(source) - GAP / 2, y_of(add) + ROW_H / 2
            body.append(f'<path d="M {x + COL_W / 2:.1f} {y1:.1f} L {left:.1f} {y1:.1f} L {left:.1f} {y2:.1f} '
                        f'L {x:.1f} {y2:.1f}" stroke="{GREY}" stroke-width="1.4" fill="none" '
                        f'marker-end="url(#arrow)" />')  # fmt: skip
    previous: dict[float, float] = {}  # column -> the bottom of its last box, for the next arrow
    for row, (kind, left, right) in enumerate(ROWS):
        fill, ink = KIND[kind]
        y = y_of(row)
        if kind == "coll":
            body += box(COL[0], y, COL[1] + COL_W - COL[0], ROW_H, fill, left, ink)
            present = COL
        else:
            body += box(COL[0], y, COL_W, ROW_H, fill, left, ink)
            if right:
                body += box(COL[1], y, COL_W, ROW_H, fill, right, ink)
            present = COL if right else COL[:1]
        for x in present:
            if x in previous:
                body.append(arrow(x + COL_W / 2, previous[x], x + COL_W / 2, y))
            previous[x] = y + ROW_H
    body.append(arrow(COL[0] + COL_W, y_of(0) + ROW_H / 2, COL[1], y_of(0) + ROW_H / 2, dash=True))
    legend = ((GREY, "replicated: the full hidden vector"), (BLUE, "sharded: this rank's heads or slice"),
              (ORANGE, "a collective, across the ranks"), (PURPLE, "host work"))  # fmt: skip
    x = 20
    for colour, label in legend:
        body += box(x, height - 30, 12, 12, colour)
        body.append(text(x + 17, height - 20, label, 10, fill="#444"))
        x += 200
    return svg(width, height, body)


FIGURES = {GRAPH: graph_launches, TP: tp_layer}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file is out of date")
    args = parser.parse_args(argv)
    stale = 0
    for target, draw in FIGURES.items():
        fresh, path = draw(), ROOT / target
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != fresh:
                print(f"out of date: {target}")
                stale += 1
            continue
        path.write_text(fresh, encoding="utf-8", newline="\n")
        print(f"wrote    {target}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
