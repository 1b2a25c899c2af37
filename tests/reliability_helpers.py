"""Shared checks for the reliability tests: real validators for every output format."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def check_exposition(body: bytes) -> None:
    """Fail unless ``promtool check metrics`` parses ``body`` (lint advice is allowed)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing (scripts/install-test-services.sh installs it)")
        pytest.skip("promtool is not installed (scripts/install-test-services.sh)")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode in (0, 3) and "error" not in out, out


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str = "1m") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted on ``directory`` for the block (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill a disk needs root")
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of ``directory`` until at most ``leave`` bytes are free."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunk = b"\0" * 4096
    try:
        while True:
            os.write(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler
