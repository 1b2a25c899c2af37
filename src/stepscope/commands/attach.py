"""Record the next N whole steps of a running process (or of every rank of a job) on demand.

``stepscope attach PID --steps N -o DIR`` asks a process started with ``stepscope run
--on-demand`` (or that called ``stepscope.listen()``, or runs with ``STEPSCOPE_LISTEN=1``) to
record its next N steps, waits, and prints where the trace is.  ``--all-ranks PID`` (any rank of
a torchrun job on this host) or ``--job DIR`` (the job's ``STEPSCOPE_LISTEN_DIR``) starts every
rank's window at the same step number; the rank files go where ``stepscope report DIR`` and
``stepscope merge`` read them.  A process without stepscope can be sampled with py-spy instead:
``--sample SECONDS`` (a sampled view, no steps).  Only your own processes can be attached to.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepscope.commands.command import Command
from stepscope.profiler.control_client import NotAttachable, Session, find_listener, hello
from stepscope.profiler.control_protocol import ControlError, RecordMessage, pid_alive, socket_pid
from stepscope.profiler.options import RecordingOptions, add_recording_arguments
from stepscope.values import MAX_SECONDS, at_least, positive_finite

RATE_PROBE_S = 0.3
"""Time between the two looks at every rank's step, to learn how fast steps go."""
NOTICE_S = 2.0
"""After this long with no step boundary, say that the window is delayed (once)."""
SEND_BUDGET_S = 1.0
"""Time allowed for every rank to take the request: the first step is that far ahead (at least
two steps: one to warm up)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope attach``."""
    parser.add_argument("pid", nargs="?", type=int, help="the process (any rank with --all-ranks)")
    parser.add_argument("--steps", type=int, default=3, help="whole steps to record (default 3)")
    add_recording_arguments(parser)
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument(
        "--all-ranks", action="store_true", help="every rank on this host of PID's job"
    )
    ranks.add_argument("--job", metavar="DIR", help="every rank listening in DIR")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up waiting after this long (default 600)",
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=None,
        metavar="SECONDS",
        help="no stepscope in the process: sample it with py-spy for SECONDS instead",
    )


def _notify(pid: int) -> Any:
    return lambda text: print(f"stepscope attach: {pid}: {text}", file=sys.stderr, flush=True)


def _report(pid: int, done: dict[str, Any], label: str = "") -> bool:
    first, steps = int(done["first_step"]), int(done["steps"])
    complete = bool(done.get("complete", True))
    last = done.get("last_step")  # the steps the trace holds (a listener before it: as asked)
    if isinstance(last, bool) or not isinstance(last, int) or last < first:
        last = first + steps - 1
    what = f"step {first}" if last == first else f"steps {first}-{last}"
    if not complete:
        what += f" (the process ended inside step {last}: partial, {steps} asked)"
    for path in done.get("files", []):
        print(f"{label}{pid}: {what}: {path}")
    return complete


def _one(args: argparse.Namespace, options: RecordingOptions) -> int:
    pid = args.pid
    try:
        path = find_listener(pid)
    except NotAttachable:
        if args.sample is not None:
            return _sample(args, options)
        raise
    _check_writable(Path(options.out))
    session = Session(path, RecordMessage(args.steps, options).to_message())
    done = session.wait(args.timeout, min(NOTICE_S, args.timeout / 2), _notify(pid))
    return 0 if _report(pid, done) else 1


def _rank_listeners(args: argparse.Namespace) -> list[tuple[Path, dict[str, Any]]]:
    """(socket, hello) of every rank: in ``--job DIR``, or of PID's job in PID's directory."""
    if args.job:
        directory, job = Path(args.job), None
    else:
        first = hello(find_listener(args.pid))
        directory, job = Path(first["dir"]), first["job"]
    found = []
    for path in sorted(directory.glob("*.sock")):
        pid = socket_pid(path)
        if pid is None or not pid_alive(pid):
            continue
        info = hello(path)
        if job is None or info["job"] == job:
            found.append((path, info))
    if not found:
        raise ControlError(f"no stepscope listener in {directory}")
    jobs = {info["job"] for _, info in found}
    if len(jobs) > 1:
        raise ControlError(f"{directory} holds listeners of {len(jobs)} jobs; name one rank's PID")
    return sorted(found, key=lambda item: item[1].get("rank") or 0)


def _first_step(listeners: list[tuple[Path, dict[str, Any]]]) -> int:
    """A step every rank is still before: ahead by what SEND_BUDGET_S covers at today's pace."""
    before = max(int(info["step"]) for _, info in listeners)
    time.sleep(RATE_PROBE_S)
    now = max(int(hello(path)["step"]) for path, _ in listeners)
    per_second = (now - before) / RATE_PROBE_S
    return now + 2 + math.ceil(per_second * SEND_BUDGET_S)


def _all_ranks(args: argparse.Namespace, options: RecordingOptions) -> int:
    listeners = _rank_listeners(args)
    _check_writable(Path(options.out))
    world = listeners[0][1].get("world_size") or len(listeners)
    if len(listeners) < world:
        print(
            f"stepscope attach: {len(listeners)} of {world} ranks listen on this host; only "
            "those are recorded",
            file=sys.stderr,
        )
    start = _first_step(listeners)
    request = RecordMessage(args.steps, options, start).to_message()
    sessions: list[tuple[dict[str, Any], Session]] = []
    for path, info in listeners:
        try:
            sessions.append((info, Session(path, request)))
        except ControlError as exc:
            for _, asked in sessions:  # a request whose client leaves before it starts is dropped
                asked.channel.conn.close()
            raise ControlError(f"rank {info.get('rank')}: {exc}; no rank records") from None
    status = 0
    for info, session in sessions:
        pid = int(info["pid"])
        try:
            done = session.wait(args.timeout, min(NOTICE_S, args.timeout / 2), _notify(pid))
        except ControlError as exc:
            print(f"stepscope attach: rank {info.get('rank')} ({pid}): {exc}", file=sys.stderr)
            status = 1
            continue
        if not _report(pid, done, f"rank {info.get('rank')} pid "):
            status = 1
    return status


def _sample(args: argparse.Namespace, options: RecordingOptions) -> int:
    from stepscope.commands.attach_sample import sample_process

    path = sample_process(args.pid, args.sample, options.sampling_rate_hz, Path(options.out))
    print(f"{args.pid}: sampled {args.sample:g} s with py-spy (no steps): {path}")
    return 0


def _check_writable(out: Path) -> None:
    """Make ``-o`` and write a file there now, before any window is asked for."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".stepscope-attach-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ControlError(
            f"-o {out}: cannot write traces there ({why}); no window was asked for"
        ) from None


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope attach``."""
    if args.all_ranks and args.pid is None:
        raise ValueError("--all-ranks needs the PID of one rank of the job")
    if args.pid is None and not args.job:
        raise ValueError("name the process: stepscope attach PID (or --job DIR)")
    at_least("--steps", args.steps, 1)
    positive_finite("--timeout", args.timeout, MAX_SECONDS, "seconds")
    positive_finite("--sample", args.sample, MAX_SECONDS, "seconds")
    options = RecordingOptions.from_args(args)
    if args.pid is not None and args.pid == os.getpid():
        raise ValueError("stepscope attach cannot attach to itself")
    try:
        if args.all_ranks or args.job:
            return _all_ranks(args, options)
        return _one(args, options)
    except ControlError as exc:
        print(f"stepscope attach: {exc}", file=sys.stderr)
        return 1


COMMAND = Command("attach", __doc__ or "", add_arguments, run)
"""``stepscope attach``."""
