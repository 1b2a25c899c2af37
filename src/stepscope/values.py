"""Numeric option values checked before anything is done with them: a value out of range is a
``ValueError`` that names its option (one line, exit status 1 on the command line, a refusal in
an attach request), whatever else would have been done with it (a schedule option is checked
even when no schedule is built)."""

from __future__ import annotations

import math

__all__ = ["MAX_SAMPLING_HZ", "MAX_SECONDS", "at_least", "positive_finite"]

MAX_SAMPLING_HZ = 100_000
"""The stack sampler's highest rate (``collectors/sampler.py`` refuses more)."""

MAX_SECONDS = 1_000_000_000
"""The longest wait asked for (about 31 years; ``inf`` or ``1e300`` overflow the platform's
timers)."""


def at_least(option: str, value: int | None, minimum: int) -> None:
    """``option``'s integer ``value`` (None: not given) is ``minimum`` or more."""
    if value is not None and value < minimum:
        raise ValueError(f"{option} must be {minimum} or more, got {value}")


def positive_finite(option: str, value: float | None, maximum: float, unit: str = "") -> None:
    """``option``'s ``value`` (None: not given) is a number above 0 and at most ``maximum``."""
    if value is None:
        return
    if not (math.isfinite(value) and 0 < value <= maximum):
        what = f" {unit}" if unit else ""
        most = f"{maximum:.0f}" if float(maximum).is_integer() else f"{maximum:g}"
        raise ValueError(
            f"{option} must be a number above 0 and at most {most}{what}, got {value:g}"
        )
