"""The event record: a dict of JSON-ready fields whose ``str()`` is a one-line summary."""

from __future__ import annotations

from typing import Any

__all__ = ["Event"]


class Event(dict[str, Any]):
    """One structured event (``start``, ``end`` or ``exception`` of a logged call).

    Keys: ``event`` (name), ``phase``, ``level``, ``ts_ns`` (Unix ns), ``mono_ns``, ``seq``,
    ``span_id``, ``parent_span_id``, ``pid``, ``thread`` (native id), ``thread_name``, ``step``,
    ``rank``, ``world_size``, ``logger``, ``attrs``, ``attrs_dropped``; ``end`` and
    ``exception`` add ``duration_ns`` and ``status``, ``exception`` adds
    ``error: {type, message}``.  Unknown values are ``None``.  It is the ``msg`` of the
    ``logging`` record, so plain formatters print the summary and ``JsonFormatter`` the fields.
    """

    __slots__ = ()

    def __str__(self) -> str:
        parts = [f"{self.get('event')} {self.get('phase')}"]
        status = self.get("status")
        if status is not None:
            parts.append(str(status))
        duration = self.get("duration_ns")
        if duration is not None:
            parts.append(f"in {duration / 1e6:.3f} ms")
        error = self.get("error")
        if isinstance(error, dict):
            parts.append(f"{error.get('type')}: {error.get('message')}")
        attrs = self.get("attrs")
        if attrs:
            parts.append(" ".join(f"{k}={v!r}" for k, v in attrs.items()))
        return " ".join(parts)
