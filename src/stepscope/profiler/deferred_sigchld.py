"""The program's own SIGCHLD handler, called after a profile's stop instead of inside it.

torch's DataLoader installs a Python SIGCHLD handler that raises ``RuntimeError: DataLoader
worker ... is killed`` on every SIGCHLD once a worker has died, and a Python handler runs at
whatever bytecode the main thread is at.  A child exiting while a profile stops (the loader's
other workers shutting down, Kineto's forked save) would raise it in the middle of the stop:
the window's file not written, a collector's hooks left installed.  While the stop runs, a
SIGCHLD is only noted; the program's handler is put back and called with it once the stop is
done, so its exception reaches the program as it would have, from a profile that did stop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["program_sigchld_deferred"]


@contextlib.contextmanager
def program_sigchld_deferred() -> Iterator[None]:
    """Within it, a SIGCHLD the program handles in Python is handled on leaving (main thread
    only: elsewhere, or without such a handler, nothing changes)."""
    number = getattr(signal, "SIGCHLD", None)
    if number is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    program = signal.getsignal(number)
    if not callable(program):
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        caught.append((signum, frame))

    try:
        signal.signal(number, note)
    except (OSError, ValueError):  # not settable here: the program's handler stays
        yield
        return
    try:
        yield
    finally:
        if signal.getsignal(number) is note:
            signal.signal(number, program)
        if caught:
            program(*caught[0])
