"""Fixtures shared by several test files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.metrics import Pipeline
from stepscope.steps import set_step


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    """A private metrics pipeline that exports only when flushed; shut down afterwards."""
    p = Pipeline(interval_s=60, handle_sigterm=False, spill_dir=tmp_path / "spill")
    yield p
    p.shutdown(timeout_s=5)
    set_step(None)
