"""Debian packages some tests need, installed on first use with apt-get (as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


def ensure_debian(packages: Sequence[str], paths: Sequence[Path]) -> str | None:
    """Install ``packages`` unless every one of ``paths`` exists; the reason when impossible."""
    if all(path.exists() for path in paths):
        return None
    if shutil.which("apt-get") is None:
        return f"no apt-get: install {' '.join(packages)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *packages]
    for step in (install, ["apt-get", "update", "-q"], install):
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 and all(path.exists() for path in paths):
            return None
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return f"apt-get could not install {' '.join(packages)} (no network?): {' / '.join(tail)}"
