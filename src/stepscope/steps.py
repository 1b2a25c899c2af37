"""The one step counter shared by the profiler, metrics and events.

The active profiler advances it on every ``step()``; metrics and events read it to tag what they
record.  With no profiler active, ``current_step()`` is ``None`` unless a program sets it itself
with ``set_step`` (for loops that are not profiled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

_step: int | None = None
_last: int | None = None
_on_declared: list[Callable[[int], None]] = []


def current_step() -> int | None:
    """The current step number, or ``None`` when no loop has declared one."""
    return _step


def set_step(step: int | None) -> None:
    """Declare the current step (the profiler calls this; programs may too)."""
    global _step, _last
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"step must be a non-negative int or None, got {step!r}")
    first = _step is None and step is not None
    _step = step
    if step is not None:
        _last = step
    if first:
        for listener in list(_on_declared):
            try:
                listener(step)  # type: ignore[arg-type]
            except Exception:  # a listener never breaks the caller's loop
                logging.getLogger("stepscope").exception("step listener %r failed", listener)


def last_step() -> int | None:
    """The last step declared in this process (kept after the loop ends), or ``None``."""
    return _last


def on_step_declared(listener: Callable[[int], None]) -> None:
    """Call ``listener(step)`` whenever the counter goes from ``None`` to a step (a loop starts)."""
    if listener not in _on_declared:
        _on_declared.append(listener)


def window_label(index: int, first_step: int, end_step: int) -> str:
    """The one name of a profile window everywhere: ``window 1 (steps 2-4)``.

    ``index`` counts from 0 (as in a trace's ``stepscope_window``); ``end_step`` is the step
    number at the window's end, one past its last recorded step.
    """
    last = max(first_step, end_step - 1)
    steps = f"step {first_step}" if last == first_step else f"steps {first_step}-{last}"
    return f"window {index + 1} ({steps})"
