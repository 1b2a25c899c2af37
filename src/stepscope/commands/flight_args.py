"""``stepscope run --flight-recorder N`` and its options: the always-on ring of the last steps
(``stepscope.FlightRecorder``), dumped on a slow step, an exception, a hang, SIGUSR1 or
``stepscope attach PID --dump``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from stepscope.values import MAX_SECONDS, at_least, positive_finite

if TYPE_CHECKING:
    from stepscope.profiler.flight_options import FlightRecorder
    from stepscope.profiler.options import RecordingOptions
    from stepscope.profiler.profile import profile

__all__ = ["add_flight_arguments", "flight_options", "flight_raised", "flight_summary"]


def add_flight_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--flight-*`` options of ``stepscope run``."""
    group = parser.add_argument_group(
        "flight recorder (the last N steps always kept, written when something goes wrong)"
    )
    group.add_argument(
        "--flight-recorder",
        type=int,
        default=None,
        metavar="N",
        help="keep the last N steps (step times, annotations, 100 Hz stacks of every thread) "
        "and write them as a trace on a slow step, an exception, a hang, SIGUSR1 or "
        "'stepscope attach PID --dump'; no scheduled windows are recorded",
    )
    group.add_argument(
        "--flight-out",
        metavar="DIR",
        default=None,
        help="directory for the dumps (default: OUT/flight)",
    )
    group.add_argument(
        "--flight-slow",
        type=float,
        default=3.0,
        metavar="K",
        help="a step over K times the rolling median step (and 20 ms) is slow (default 3)",
    )
    group.add_argument(
        "--flight-hang",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="no step ended for this long: dump the ring and every thread's stack "
        "(default 300, 0: no watchdog)",
    )
    group.add_argument(
        "--flight-window",
        type=int,
        default=0,
        metavar="K",
        help="a trigger also records the next K steps as a full window with the recording "
        "options given (--activities, --with-stack, --memory); default 0: none",
    )
    group.add_argument(
        "--flight-max-dumps",
        type=int,
        default=20,
        metavar="N",
        help="most dumps written (default 20); later triggers are counted as suppressed",
    )


def flight_options(args: argparse.Namespace, options: RecordingOptions) -> FlightRecorder | None:
    """The ``FlightRecorder`` the options ask for (None without ``--flight-recorder``), writing
    where the recording ``options`` say and sampling at their rate; a ``ValueError`` naming the
    option when one is out of range."""
    if args.flight_recorder is None:
        return None
    from stepscope.profiler.flight_options import MAX_FLIGHT_STEPS, MAX_RATE_HZ, FlightRecorder

    at_least("--flight-recorder", args.flight_recorder, 1)
    if args.flight_recorder > MAX_FLIGHT_STEPS:
        raise ValueError(f"--flight-recorder must be at most {MAX_FLIGHT_STEPS}")
    at_least("--flight-window", args.flight_window, 0)
    at_least("--flight-max-dumps", args.flight_max_dumps, 0)
    positive_finite("--flight-slow", args.flight_slow, 1e9)
    if args.flight_slow <= 1:
        raise ValueError(f"--flight-slow must be above 1, got {args.flight_slow:g}")
    if args.flight_hang:
        positive_finite("--flight-hang", args.flight_hang, MAX_SECONDS, "seconds")
    if options.sampling_rate_hz > MAX_RATE_HZ:
        raise ValueError(
            f"--sampling-rate {options.sampling_rate_hz:g} with --flight-recorder: the ring "
            f"samples all the time, at most {MAX_RATE_HZ:g} per second"
        )
    if getattr(args, "on_demand", False):
        raise ValueError(
            "--flight-recorder and --on-demand cannot be combined yet: a flight recorder "
            "answers 'stepscope attach PID --dump' itself"
        )
    return FlightRecorder(
        steps=args.flight_recorder,
        out=args.flight_out or os.path.join(options.out, "flight"),
        slow_factor=args.flight_slow,
        hang_s=args.flight_hang,
        window_steps=args.flight_window,
        max_dumps=args.flight_max_dumps,
        sampling_rate_hz=options.sampling_rate_hz,
        gzip=options.gzip,
    )


def flight_raised(prof: object, exc: BaseException) -> None:
    """The program under ``run`` raised: its flight recorder (if any) dumps the ring."""
    flight = getattr(prof, "flight", None)
    if flight is not None:
        flight.program_raised(exc)


def flight_summary(prof: profile, name: str) -> bool:
    """Say what the flight recorder wrote (stderr); False when the profile had none."""
    flight = prof.flight
    if flight is None:
        return False
    out = sys.stderr
    print(f"stepscope run: {name}: flight recorder: {len(flight.dumps)} dump(s)", file=out)
    for path in flight.dumps:
        print(f"  {path}", file=out)
    return True
