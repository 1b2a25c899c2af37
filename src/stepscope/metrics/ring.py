"""The bounded, non-blocking ring between callers and the export thread.

Callers append ``(target, a, b)`` tuples, ``target`` a :class:`RingTarget`; the export thread
drains them and calls ``target.drain(a, b)`` (after resolving tensor values in batches).
``put`` never blocks and never does I/O: when the ring is full the item is counted as
dropped.  A deque's ``append`` and ``popleft`` are atomic under the GIL, so no lock is taken
per call; the length check may let a few concurrent writers overshoot ``capacity`` by one
item each, which keeps memory bounded.

Other parts of stepscope (structured events) use it through :class:`Channel`: records put on a
channel are handed, in batches, to the channel's :class:`RecordSink` on the export thread.
"""

from __future__ import annotations

import abc
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

__all__ = ["DEFAULT_CAPACITY", "RECORDS", "Channel", "RecordSink", "Ring", "RingTarget"]

DEFAULT_CAPACITY = 65536

RECORDS = "metrics"
"""The drop key of the pipeline's records (scalar samples, torchelastic API values): the items
counted as produced and accounted per exporter."""


class RingTarget(Protocol):
    """What an item in the ring is for: its owner, which takes the item back on the export thread.

    ``drop_key`` names the kind under which the ring counts it when full; ``is_record`` says
    whether it is one of the pipeline's records (counted as produced, accounted per exporter).
    """

    @property
    def drop_key(self) -> str:
        """The kind under which the ring counts this target's items when it is full."""

    @property
    def is_record(self) -> bool:
        """Whether its items are pipeline records (counted as produced)."""

    def drain(self, a: Any, b: Any) -> None:
        """Take back one queued item ``(a, b)`` (export thread only); a tensor ``b`` arrives
        resolved to its number."""


class Ring:
    """A bounded multi-producer, single-consumer queue that counts what it drops."""

    __slots__ = ("_dropped", "_lock", "_wake", "capacity", "high_water", "items")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.items: deque[tuple[RingTarget, Any, Any]] = deque()
        self.capacity = capacity
        self.high_water = capacity * 3 // 4
        self._dropped: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None
        self.set_capacity(capacity)

    def set_capacity(self, capacity: int) -> None:
        """Change the bound (items already queued stay)."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ring capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.high_water = capacity * 3 // 4

    def set_waker(self, wake: Callable[[], None] | None) -> None:
        """Called (from the producer) when the ring passes three quarters full."""
        self._wake = wake

    def put(self, target: RingTarget, a: Any, b: Any = None) -> bool:
        """Queue one item; False (counted under ``target.drop_key``) when the ring is full."""
        items = self.items
        n = len(items)
        if n < self.high_water:
            items.append((target, a, b))
            return True
        if n < self.capacity:
            items.append((target, a, b))
            self.nudge()
            return True
        self.count_drop(target.drop_key)
        return False

    def nudge(self) -> None:
        """Wake the consumer early (the ring is filling up)."""
        wake = self._wake
        if wake is not None:
            wake()

    def count_drop(self, key: str) -> None:
        """Count one item of kind ``key`` that did not fit."""
        with self._lock:
            self._dropped[key] = self._dropped.get(key, 0) + 1

    def dropped(self, key: str | None = None) -> int:
        """Items refused because the ring was full (of kind ``key``, or all)."""
        if key is None:
            return sum(self._dropped.values())
        return self._dropped.get(key, 0)

    def __len__(self) -> int:
        return len(self.items)

    def drain(self, limit: int | None = None) -> list[tuple[RingTarget, Any, Any]]:
        """Remove and return up to ``limit`` items (default: what is queued now), oldest first."""
        items = self.items
        n = len(items) if limit is None else min(limit, len(items))
        pop = items.popleft
        return [pop() for _ in range(n)]

    def reset_after_fork(self) -> None:
        """Forget the parent's queued items and counts; new lock."""
        self.items.clear()
        self._dropped = {}
        self._lock = threading.Lock()


class RecordSink(abc.ABC):
    """Where a channel's records go; called on the export thread with batches."""

    name: str = "sink"

    @abc.abstractmethod
    def write_records(self, records: Sequence[Any], timeout_s: float) -> None:
        """Deliver ``records`` (oldest first); raise to signal failure (retried, then spilled)."""

    def spill_form(self, record: Any) -> Any:
        """A JSON-serialisable form of ``record`` for the spill file."""
        return record

    def after_fork_in_child(self) -> None:  # noqa: B027 - optional hook
        """Reopen per-process resources in a forked child."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at shutdown (after the last batch)."""


class Channel:
    """A named lane through the ring: ``put(record)`` never blocks; the sink gets batches."""

    __slots__ = ("_pending", "_ring", "closed", "drop_key", "name", "sink")
    is_record: ClassVar[bool] = False

    def __init__(self, name: str, sink: RecordSink, ring: Ring) -> None:
        self.name = name
        self.sink = sink
        self.drop_key = f"channel:{name}"
        self.closed = False
        self._ring = ring
        self._pending: list[Any] = []

    def put(self, record: Any) -> bool:
        """Queue ``record`` for the sink; False (and counted as dropped) when the ring is full."""
        if self.closed:
            self._ring.count_drop(self.drop_key)
            return False
        return self._ring.put(self, record)

    def drain(self, record: Any, _unused: Any) -> None:
        """Keep a drained record for the next delivery (or count it if the channel closed)."""
        if self.closed:
            self._ring.count_drop(self.drop_key)
        else:
            self._pending.append(record)

    def take_pending(self) -> list[Any]:
        """Records drained since the last call (export thread only)."""
        pending, self._pending = self._pending, []
        return pending

    def pending_count(self) -> int:
        """Records drained but not yet handed to the sink."""
        return len(self._pending)
