"""Draw chapter 06's schematic: the host and GPU lanes of a few steps, without and with overlap.

    python -m scripts.draw_overlap_timeline           # writes docs/assets/overlap_timeline.svg
    python -m scripts.draw_overlap_timeline --check   # exit 1 if the committed file is out of date

The costs are illustrative, not measured (the measured timeline is rendered from a profile by
scripts/render_profile.py): scheduling and launching a step takes the host 3 units, processing a
step's tokens 2, and the GPU runs a step in 6. Without overlap a step costs 3 + 6 + 2 = 11 units
and the GPU idles 5 of them; with overlap the host's 5 units hide under the GPU's 6, and a step
costs 6. Plain SVG, written by hand, so the file is the same on every machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path("docs/assets/overlap_timeline.svg")

LAUNCH, PROCESS, KERNELS = 3, 2, 6  # time units
STEPS = 4
SCALE = 16.0  # pixels per unit
LEFT, WIDTH = 110.0, 880
COLOURS = {
    "launch": "#3f6fb5",  # schedule, prepare, launch
    "process": "#e67e22",  # wait for the tokens, append, stop checks, detokenize, free
    "kernels": "#27ae60",
    "idle": "#f5d5d0",
}
FONT = 'font-family="Helvetica, Arial, sans-serif"'


def serial() -> tuple[list, list]:
    """(host, gpu) segments as (start, length, kind, label): schedule+launch, kernels, process."""
    host, gpu, t = [], [], 0
    for n in range(STEPS):
        host.append((t, LAUNCH, "launch", f"launch {n}"))
        gpu.append((t + LAUNCH, KERNELS, "kernels", f"step {n}"))
        host.append((t + LAUNCH + KERNELS, PROCESS, "process", f"proc {n}"))
        t += LAUNCH + KERNELS + PROCESS
    return host, gpu


def overlapped() -> tuple[list, list]:
    """Launch step n+1, then process step n while n+1 runs; the GPU starts each step when both
    the host has launched it and the previous step is done."""
    host, gpu, t, gpu_free = [], [], 0, 0
    ends = []
    for n in range(STEPS + 1):
        if n < STEPS:
            host.append((t, LAUNCH, "launch", f"launch {n}"))
            t += LAUNCH
            start = max(t, gpu_free)
            gpu.append((start, KERNELS, "kernels", f"step {n}"))
            gpu_free = start + KERNELS
            ends.append(gpu_free)
        if n > 0:  # process the previous step: wait for it, then the host's work
            t = max(t, ends[n - 1])
            host.append((t, PROCESS, "process", f"proc {n - 1}"))
            t += PROCESS
    return host, gpu


def idle(gpu: list, end: float) -> list:
    gaps, t = [], 0.0
    for start, length, _, _ in gpu:
        if start > t:
            gaps.append((t, start - t, "idle", "idle"))
        t = start + length
    if end > t:
        gaps.append((t, end - t, "idle", ""))
    return gaps


def rect(
    x: float, y: float, w: float, h: float, fill: str, label: str, text_fill: str = "white"
) -> list[str]:
    out = [
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" stroke="white" stroke-width="1" />'
    ]
    if label and w >= 30:
        out.append(f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4:.1f}" {FONT} font-size="9" text-anchor="middle" fill="{text_fill}">{label}</text>')  # fmt: skip
    return out


def text(x: float, y: float, s: str, size: int = 11, anchor: str = "start", weight: str = "normal", fill: str = "#222") -> str:  # fmt: skip
    return f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">{s}</text>'  # fmt: skip


def panel(y: float, title: str, host: list, gpu: list, end: float) -> list[str]:
    out = [text(20, y, title, 12, weight="bold")]
    lanes = (("host", y + 14, host), ("GPU", y + 48, gpu + idle(gpu, end)))
    for name, top, segments in lanes:
        out.append(text(LEFT - 10, top + 19, name, 11, anchor="end", fill="#444"))
        for start, length, kind, label in segments:
            fill = "#8a3b2f" if kind == "idle" else "white"
            out += rect(LEFT + start * SCALE, top, length * SCALE, 28, COLOURS[kind], label, fill)
    return out


def draw() -> str:
    host_s, gpu_s = serial()
    host_o, gpu_o = overlapped()
    end_s = STEPS * (LAUNCH + KERNELS + PROCESS)
    end_o = max(s + n for s, n, _, _ in host_o)
    axis_y = 300
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{axis_y + 70}" viewBox="0 0 {WIDTH} {axis_y + 70}">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{axis_y + 70}" fill="white" stroke="none" />',
        text(
            20,
            22,
            f"{STEPS} decode steps: what the host and the GPU do, without and with overlap",
            13,
            weight="bold",
        ),
        text(
            20,
            40,
            f"(illustrative costs, in time units: scheduling and launching a step {LAUNCH}, processing its tokens "
            f"{PROCESS}, the GPU's work on a step {KERNELS})",
            10,
            fill="#666",
        ),  # fmt: skip
    ]
    lines += panel(72, f"Overlap off: each step is schedule, launch, wait, process; the GPU idles {LAUNCH + PROCESS} "
                       f"of every {LAUNCH + KERNELS + PROCESS} units", host_s, gpu_s, end_s)  # fmt: skip
    lines += panel(178, f"Overlap on: step n+1 is launched before step n is processed; the host's "
                        f"{LAUNCH + PROCESS} units hide under the GPU's {KERNELS}", host_o, gpu_o, end_o)  # fmt: skip
    # The time axis, and where each loop is done with the steps.
    lines.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{LEFT + end_s * SCALE}" y2="{axis_y}" stroke="#444" stroke-width="1" />')  # fmt: skip
    for t in range(0, end_s + 1, 4):
        x = LEFT + t * SCALE
        lines.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#444" stroke-width="1" />')  # fmt: skip
        lines.append(text(x, axis_y + 16, str(t), 9, anchor="middle", fill="#444"))
    lines.append(text(LEFT, axis_y + 34, "time (units)", 10, fill="#444"))
    for end, y in ((end_s, 72), (end_o, 178)):
        x = LEFT + end * SCALE
        lines.append(f'<line x1="{x:.1f}" y1="{y + 6}" x2="{x:.1f}" y2="{axis_y}" stroke="#222" stroke-width="1" stroke-dasharray="4,3" />')  # fmt: skip
        room = x + 100 < WIDTH  # the label right of the line, beside the host lane, if it fits
        lines.append(text(x + 6 if room else x - 4, y + 33 if room else y + 4, f"done: {end} units", 10,
                          anchor="start" if room else "end"))  # fmt: skip
    legend = (("launch", "schedule + prepare + launch"), ("process", "process the tokens (blank: waiting)"),
              ("kernels", "GPU: the step's kernels"), ("idle", "GPU idle"))  # fmt: skip
    x = LEFT
    for kind, label in legend:
        lines.append(f'<rect x="{x:.1f}" y="{axis_y + 44}" width="12" height="12" fill="{COLOURS[kind]}" />')
        lines.append(text(x + 17, axis_y + 54, label, 10, fill="#444"))
        x += 190
    lines.append("</svg>")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed SVG is out of date")
    args = parser.parse_args(argv)
    target = ROOT / TARGET
    fresh = draw()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current != fresh:
            print(f"out of date: {TARGET}")
            return 1
        return 0
    target.write_text(fresh, encoding="utf-8", newline="\n")
    print(f"wrote    {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
