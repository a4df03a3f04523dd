"""Where a benchmark ran: the machine and the software, recorded next to every number.

python -m stages.common.hardware     # print both as JSON
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    # platform.processor() is often empty or just "x86_64" on Linux; /proc/cpuinfo has the name.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (a container's limit, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def device_tag(device: str = "auto") -> str:
    """The short name results carry for where they ran: `cpu`, or the GPU's model as
    scripts/gpu_run.sh writes it (`h200`, `h100`; `gpu` for a name without one). `device` is what
    the run asked for: `cpu` is the CPU whatever the machine has."""
    import torch

    if (
        device == "cpu"
        or not (device == "auto" or device.startswith("cuda"))
        or not torch.cuda.is_available()
    ):
        return "cpu"
    found = re.findall(r"[abhl]\d+", torch.cuda.get_device_name().lower())
    return found[0] if found else "gpu"


def describe() -> dict[str, Any]:
    """`cpu` and `gpu` (None without CUDA) as benchmarks/README.md requires, and the details."""
    import torch

    # The threads a run used are part of its config (bench --threads), not of the machine.
    info: dict[str, Any] = {"cpu": cpu_model(), "cpu_cores": usable_cores(), "gpu": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_count": torch.cuda.device_count(),
            "gpu_memory_gb": round(props.total_memory / 2**30, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        }
        driver = _driver_version()
        if driver:
            info["driver"] = driver
    return info


def versions() -> dict[str, Any]:
    """python, torch, transformers always; attention libraries when installed; the repo's commit."""
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for key, dist in [
        ("transformers", "transformers"),
        ("flashinfer", "flashinfer-python"),
        ("flash_attn", "flash-attn-4"),
        ("flash_attn", "flash-attn"),
        ("cutlass_dsl", "nvidia-cutlass-dsl"),  # FlashAttention 4's compiler
        ("triton", "triton"),
    ]:
        if key in out:
            continue
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    commit = git_commit()
    if commit:
        out["git_commit"] = commit
    switches = engine_switches()
    if switches:
        out["engine_switches"] = switches
    return out


def engine_switches() -> str:
    """final/'s switches set in the environment for this run, as `KEY=value` words (FINAL_PDL=0,
    FINAL_PREFILL_GRAPHS=65536, FINAL_FA4_REPLAY=0): a result measured with one records it beside
    the versions, so a figure never loses the setting it was measured under."""
    return " ".join(f"{key}={value}" for key, value in sorted(os.environ.items()) if key.startswith("FINAL_"))


GIT_COMMIT_ENV = "BENCH_GIT_COMMIT"


def git_commit() -> str | None:
    """The checkout's commit, with "-dirty" when tracked files differ from it. $BENCH_GIT_COMMIT,
    when set, wins: a lent GPU host receives a copy of the working tree whose git metadata is not
    the checkout's (there `git` names an older commit, "-dirty"), so the caller passes the commit."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        commit = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10
    )
    return result.stdout.strip()


def _driver_version() -> str | None:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


if __name__ == "__main__":
    import json

    print(json.dumps({"hardware": describe(), "versions": versions()}, indent=2))
