"""The flight recorder's settings: ``profile(flight_recorder=N)`` or ``FlightRecorder(...)``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from stepscope.profiler.schedule import ProfilerAction

__all__ = ["MAX_FLIGHT_STEPS", "FlightRecorder", "flight_recorder_of", "never_record"]

MAX_FLIGHT_STEPS = 100_000
"""Most steps a ring may keep (its rows, spans and samples are held in memory)."""
MAX_RATE_HZ = 1_000.0
"""Highest sampling rate of the always-on sampler (its cost grows with the rate)."""


def _whole(name: str, value: object, least: int, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number of {least} or more, got {value!r}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be at most {most}, got {value!r}")
    return value


def _seconds(name: str, value: object, zero_ok: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):  # type: ignore[operator]
        least = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"{name} must be a finite number of seconds {least}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FlightRecorder:
    """What the always-on flight recorder keeps, what makes it write a dump, and where."""

    steps: int = 100
    """Steps kept before the step that triggers a dump (the ring holds ``steps + 1``)."""
    out: str = "out/stepscope/flight"
    """Directory the dumps (and triggered windows) are written into."""
    slow_factor: float = 3.0
    """A step slower than this times the rolling median of the recent steps is slow ..."""
    slow_min_s: float = 0.02
    """... when it also takes at least this long (µs-long steps jitter by more than 3x)."""
    hang_s: float = 300.0
    """No step ended for this long: the watchdog dumps the ring and every thread's stack (0:
    no watchdog)."""
    window_steps: int = 0
    """A trigger also records the next this many steps as a full window with the profile's
    own recording options (torch ops, stacks, memory); 0: none."""
    min_steps_between: int | None = None
    """Automatic dumps (slow step, hang, SIGUSR1) at least this many steps apart (None: as
    many as ``steps``); closer ones are suppressed and counted."""
    max_dumps: int = 20
    """Most dumps one process writes (the exception dump at exit is always written); later
    triggers are suppressed and counted."""
    sampling_rate_hz: float = 100.0
    """Mean stack samples per second of every thread (0: no samples in the ring)."""
    max_samples: int = 500_000
    """Most stack samples held (about 21 bytes each); the oldest go first beyond it."""
    max_spans: int = 200_000
    """Most annotation spans held by the ring; more are dropped and counted."""
    on_signal: bool = True
    """SIGUSR1 writes a dump (chained with the program's own handler, never replacing it)."""
    attachable: bool = True
    """Listen for ``stepscope attach PID --dump`` (unless a listener already runs here)."""
    gzip: bool = False
    """Write ``.json.gz`` dumps."""
    extra: dict[str, str] = field(default_factory=dict, compare=False)
    """Entries added to every dump's ``stepscope_flight`` metadata (a job name, say)."""

    def __post_init__(self) -> None:
        _whole("flight_recorder steps", self.steps, 1, MAX_FLIGHT_STEPS)
        if not isinstance(self.out, (str, os.PathLike)) or not str(self.out):
            raise ValueError(f"flight recorder out must be a directory path, got {self.out!r}")
        factor = self.slow_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
            raise ValueError(f"slow_factor must be a number above 1, got {factor!r}")
        if not math.isfinite(factor):
            raise ValueError(f"slow_factor must be finite, got {factor!r}")
        _seconds("slow_min_s", self.slow_min_s, zero_ok=True)
        _seconds("hang_s", self.hang_s, zero_ok=True)
        _whole("window_steps", self.window_steps, 0, 1000)
        if self.min_steps_between is not None:
            _whole("min_steps_between", self.min_steps_between, 1)
        _whole("max_dumps", self.max_dumps, 0)
        rate = self.sampling_rate_hz
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise ValueError(f"sampling_rate_hz must be a number, got {rate!r}")
        if not (rate == 0 or 0 < rate <= MAX_RATE_HZ):
            raise ValueError(
                f"flight recorder sampling_rate_hz must be 0 (off) or above 0 and at most "
                f"{MAX_RATE_HZ:g}, got {rate!r}"
            )
        _whole("max_samples", self.max_samples, 1)
        _whole("max_spans", self.max_spans, 1)

    @property
    def spacing(self) -> int:
        """Least steps between two automatic dumps."""
        return self.steps if self.min_steps_between is None else self.min_steps_between


def flight_recorder_of(value: object) -> FlightRecorder | None:
    """The settings for ``profile(flight_recorder=value)``: N steps, a ``FlightRecorder``, or
    None (no flight recorder)."""
    if value is None or isinstance(value, FlightRecorder):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"flight_recorder must be a number of steps or a stepscope.FlightRecorder, got "
            f"{value!r}"
        )
    return FlightRecorder(steps=value)


def never_record(step: int) -> ProfilerAction:
    """The schedule of a flight recorder's profile given none: no window, only the ring."""
    return ProfilerAction.NONE
