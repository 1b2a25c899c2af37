"""Which logged call is running (a context variable), span ids and the per-process ``seq``.

The innermost logged call lives in a ``ContextVar``, so parent links follow the code through
asyncio tasks (a task copies the context it was created in) and into threads started with a
copied context (``contextvars.copy_context().run``, ``asyncio.to_thread``).  A plain new thread
starts with no current call.  Span ids are 16 hex digits: a random per-process prefix and a
counter.  A forked child gets a new prefix and starts ``seq`` again at 0.
"""

from __future__ import annotations

import itertools
import os
from contextvars import ContextVar
from typing import TYPE_CHECKING

from stepscope import forks

if TYPE_CHECKING:
    from stepscope.events.call import Call

__all__ = ["current_call", "current_span_id", "new_span_id", "next_seq", "process_id"]

CURRENT: ContextVar[Call | None] = ContextVar("stepscope_events_current", default=None)


class _Counters:
    """Per-process counters (replaced in a forked child)."""

    __slots__ = ("pid", "prefix", "seq", "spans")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.prefix = os.urandom(4).hex()
        self.seq = itertools.count()
        self.spans = itertools.count(1)


_counters = _Counters()


def next_seq() -> int:
    """The next event number of this process (0, 1, 2 ...; a gap means a lost event)."""
    return next(_counters.seq)


def process_id() -> int:
    """``os.getpid()``, read once per process."""
    return _counters.pid


def new_span_id() -> str:
    """A span id unique within the process and, with high probability, across processes."""
    c = _counters
    return f"{c.prefix}{next(c.spans):08x}"


def current_call() -> Call | None:
    """The innermost logged call running in this context, or None."""
    return CURRENT.get()


def current_span_id() -> str | None:
    """The span id of the innermost logged call running in this context, or None."""
    call = CURRENT.get()
    return None if call is None else call.span_id


def _reset_in_child() -> None:
    global _counters
    _counters = _Counters()


forks.after_fork_in_child(_reset_in_child)
