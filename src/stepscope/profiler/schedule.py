"""Step schedules: which steps wait, warm up, record, and record-and-save (torch's semantics)."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable

__all__ = ["ProfilerAction", "Schedule", "action_at", "default_schedule", "schedule"]


class ProfilerAction(enum.Enum):
    """What the profiler does during a step."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


Schedule = Callable[[int], ProfilerAction]


def _check(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"schedule: {name} must be an int, got {value!r}")
    if value < minimum:
        need = "positive" if minimum == 1 else "zero or more"
        raise ValueError(f"schedule: {name} must be {need}, got {value}")
    return value


def schedule(
    *,
    wait: int,
    warmup: int,
    active: int,
    repeat: int = 0,
    skip_first: int = 0,
    skip_first_wait: int = 0,
) -> Schedule:
    """A schedule: skip ``skip_first`` steps, then cycles of wait, warmup and active steps.

    The last active step of each cycle is ``RECORD_AND_SAVE``; ``repeat=0`` repeats forever;
    a non-zero ``skip_first_wait`` drops the wait of the first cycle.
    """
    _check("wait", wait, 0)
    _check("warmup", warmup, 0)
    _check("active", active, 1)
    _check("repeat", repeat, 0)
    _check("skip_first", skip_first, 0)
    _check("skip_first_wait", skip_first_wait, 0)
    if warmup == 0:
        warnings.warn(
            "Profiler won't be using warmup, this can skew profiler results", stacklevel=2
        )
    cycle = wait + warmup + active

    def schedule_fn(step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError(f"schedule: step must be zero or more, got {step}")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat > 0 and step >= repeat * cycle:
            return ProfilerAction.NONE
        position = step % cycle
        if position < wait:
            return ProfilerAction.NONE
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if position < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return schedule_fn


def default_schedule(step: int) -> ProfilerAction:
    """Record every step (the behaviour without a schedule)."""
    return ProfilerAction.RECORD


def action_at(schedule_fn: Schedule, step: int) -> ProfilerAction:
    """``schedule_fn(step)``; a ``TypeError`` when it is no ``ProfilerAction``."""
    action = schedule_fn(step)
    if not isinstance(action, ProfilerAction):
        raise TypeError(f"schedule({step}) returned {action!r}; it must return a ProfilerAction")
    return action
