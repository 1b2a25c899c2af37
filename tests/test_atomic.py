"""Atomic output: complete files only, normal permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stepscope.atomic import atomic_output

pytestmark = pytest.mark.implementation_independent


def test_new_files_get_the_umask_mode_and_replacements_keep_theirs(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        target = tmp_path / "a.txt"
        with atomic_output(target) as fh:
            fh.write(b"one")
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        target.chmod(0o600)
        with atomic_output(target) as fh:
            fh.write(b"two")
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        assert target.read_bytes() == b"two"
    finally:
        os.umask(old)


def test_an_error_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "b.txt"
    with pytest.raises(RuntimeError), atomic_output(target) as fh:
        fh.write(b"partial")
        raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []
    with (
        pytest.raises(FileNotFoundError, match="does not exist"),
        atomic_output(tmp_path / "x" / "y"),
    ):
        pass
