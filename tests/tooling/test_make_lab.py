"""`make lab` starts JupyterLab as a user and as root: Jupyter refuses root without --allow-root
(the usual user in a container), so the Makefile passes it then, and only then. A dry run
(`make -n`) with `id` answering each uid shows the command it would run."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(("uid", "allow_root"), [("0", True), ("1000", False)])
def test_make_lab_passes_allow_root_only_as_root(tmp_path, uid, allow_root):
    fake_id = tmp_path / "id"
    fake_id.write_text(f"#!/bin/sh\necho {uid}\n")
    fake_id.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["make", "-n", "lab"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    command = next(line for line in proc.stdout.splitlines() if "-m jupyterlab" in line)
    assert ("--allow-root" in command.split()) == allow_root, command
