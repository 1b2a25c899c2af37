"""The one clock of stepscope: monotonic nanoseconds plus one wall-clock base per process.

Every timestamp stepscope records comes from here.  With the C extension on a CPU with an
invariant TSC (and a kernel that trusts it), readings are TSC ticks calibrated against
``CLOCK_MONOTONIC``; otherwise ``CLOCK_MONOTONIC`` itself.  The pure-Python twin uses
``time.monotonic_ns``.  ``STEPSCOPE_CLOCK=monotonic`` forces the non-TSC path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from stepscope import _ext
from stepscope._ext import native

__all__ = [
    "SOURCE",
    "clock_info",
    "now_ns",
    "refine",
    "ticks",
    "ticks_to_ns",
    "to_unix_ns",
    "wall_base_ns",
]

_CLOCKSOURCE = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")


def _kernel_trusts_tsc() -> bool:
    try:
        return _CLOCKSOURCE.read_text().strip() == "tsc"
    except OSError:
        return False


def _select() -> tuple[str, Callable[[], int], Callable[[], int], Callable[[int], int]]:
    mod = native()
    if mod is None:
        return "python_monotonic", time.monotonic_ns, time.monotonic_ns, int
    wants_tsc = os.environ.get("STEPSCOPE_CLOCK", "auto") != "monotonic" and _kernel_trusts_tsc()
    uses_tsc = bool(mod._clock_configure(wants_tsc))
    source = "tsc" if uses_tsc else "clock_monotonic"
    return source, mod.now_ns, mod.ticks, mod.ticks_to_ns


SOURCE: str
"""Where readings come from: ``tsc``, ``clock_monotonic`` or ``python_monotonic``."""

SOURCE, now_ns, ticks, ticks_to_ns = _select()


def _measure_wall_base() -> int:
    best_width: int | None = None
    base = 0
    for _ in range(9):
        before = now_ns()
        wall = time.time_ns()
        after = now_ns()
        if best_width is None or after - before < best_width:
            best_width = after - before
            base = wall - (before + after) // 2
    return base


_WALL_BASE_NS = _measure_wall_base()


def wall_base_ns() -> int:
    """Unix time (ns) at monotonic zero for this process; fixed once per process."""
    return _WALL_BASE_NS


def to_unix_ns(mono_ns: int) -> int:
    """Convert a monotonic timestamp from :func:`now_ns` to Unix-epoch nanoseconds."""
    return mono_ns + _WALL_BASE_NS


def refine() -> int:
    """Lengthen the TSC calibration baseline; returns the offset from CLOCK_MONOTONIC (ns)."""
    mod = native()
    if SOURCE != "tsc" or mod is None:
        return 0
    offset = mod._clock_refine()
    return int(offset) if offset is not None else 0


def clock_info() -> dict[str, object]:
    """Describe the clock for trace metadata, with which implementation runs (and why)."""
    info: dict[str, object] = {"source": SOURCE, "wall_base_ns": _WALL_BASE_NS}
    info["extension"] = _ext.status()
    mod = native()
    if mod is not None and SOURCE == "tsc":
        info["tsc_hz"] = round(float(mod.ticks_per_second()))
    return info
