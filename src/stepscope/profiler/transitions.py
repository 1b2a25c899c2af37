"""What a profile does at each transition of its schedule's actions (torch.profiler's table).

``(previous, current)`` -> the calls to make, in order; ``current`` None is the profile's stop.
A transition torch calls an incorrect schedule warns as torch does and still closes the window.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from stepscope.profiler.schedule import ProfilerAction

__all__ = ["ActionMap", "action_map"]

Call = Callable[[], Any]
ActionMap = dict[tuple[ProfilerAction, ProfilerAction | None], list[Call]]


def action_map(
    *,
    prepare: Call,
    start: Call,
    stop: Call,
    ready: Call,
    ended_early: Call,
    ended_in_warmup: Call | None,
) -> ActionMap:
    """The table, from the profile's window calls (``ended_in_warmup`` None: a loop that ends
    during a warmup saves nothing, as torch; else that window is flagged and handed over)."""
    A = ProfilerAction

    def warn(message: str) -> Call:
        return lambda: warnings.warn(message, stacklevel=4)

    exit_warmup: list[Call] = [start, stop]
    if ended_in_warmup is not None:
        exit_warmup = [ended_in_warmup, *exit_warmup, ready]
    return {
        (A.NONE, A.NONE): [],
        (A.NONE, A.WARMUP): [prepare],
        (A.NONE, A.RECORD): [prepare, start],
        (A.NONE, A.RECORD_AND_SAVE): [prepare, start],
        (A.WARMUP, A.NONE): [warn("Incorrect schedule: WARMUP followed by NONE"), start, stop],
        (A.WARMUP, A.WARMUP): [],
        (A.WARMUP, A.RECORD): [start],
        (A.WARMUP, A.RECORD_AND_SAVE): [start],
        (A.RECORD, A.NONE): [warn("Incorrect schedule: RECORD followed by NONE"), stop],
        (A.RECORD, A.WARMUP): [warn("Incorrect schedule: RECORD followed by WARMUP"), stop],
        (A.RECORD, A.RECORD): [],
        (A.RECORD, A.RECORD_AND_SAVE): [],
        (A.RECORD_AND_SAVE, A.NONE): [stop, ready],
        (A.RECORD_AND_SAVE, A.WARMUP): [stop, ready, prepare],
        (A.RECORD_AND_SAVE, A.RECORD): [stop, ready, prepare, start],
        (A.RECORD_AND_SAVE, A.RECORD_AND_SAVE): [stop, ready, prepare, start],
        (A.NONE, None): [],
        (A.WARMUP, None): exit_warmup,
        (A.RECORD, None): [ended_early, stop, ready],
        (A.RECORD_AND_SAVE, None): [stop, ready],
    }
