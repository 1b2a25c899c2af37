"""Where events go besides the trace: JSON formatting for ``logging``, and a JSON-lines file.

:class:`JsonFormatter` renders every record as one JSON object on one line: events with all
their fields, plain records as ``ts_ns, level, logger, message, pid, thread_name, file, line``
(plus ``exc`` and the record's ``extra`` values as ``attrs``).  :class:`JsonlHandler` puts the
same objects on a channel of the metrics pipeline; its export thread appends them to a file that
rotates by size, so the calling thread never does I/O.  What does not fit in the ring is
counted (``handler.dropped``, and the pipeline's telemetry under the channel's name).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepscope.events.coerce import AttrSet
from stepscope.events.decorator import resolve_logger
from stepscope.events.event import Event
from stepscope.jsonenc import json_bytes
from stepscope.metrics.default import get_pipeline
from stepscope.metrics.exporters.files import RotatingFile
from stepscope.metrics.pipeline import Pipeline
from stepscope.metrics.ring import Channel, RecordSink

__all__ = ["JsonFormatter", "JsonlHandler", "JsonlSink", "as_json_object", "log_to_jsonl"]

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_plain = logging.Formatter()


def as_json_object(
    record: logging.LogRecord, formatter: logging.Formatter | None = None
) -> dict[str, Any]:
    """The JSON object of a record: the event's fields, or the plain record's."""
    msg = record.msg
    if isinstance(msg, Event):
        return msg
    fmt = formatter or _plain
    out: dict[str, Any] = {
        "ts_ns": int(record.created * 1e9),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
        "pid": record.process,
        "thread_name": record.threadName,
        "file": record.pathname,
        "line": record.lineno,
    }
    if record.exc_info:
        out["exc"] = fmt.formatException(record.exc_info)
    elif record.exc_text:
        out["exc"] = record.exc_text
    if record.stack_info:
        out["stack"] = fmt.formatStack(record.stack_info)
    extra = [k for k in record.__dict__ if k not in _STANDARD_ATTRS]
    if extra:
        attrs = AttrSet()
        for key in extra:
            attrs.add(key, record.__dict__[key])
        out["attrs"] = attrs.values
        if attrs.dropped:
            out["attrs_dropped"] = attrs.dropped
    return out


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON (always valid UTF-8 JSON, whatever the values)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record's JSON object, without a newline (handlers add it)."""
        return json_bytes(as_json_object(record, self)).decode("utf-8")


class JsonlSink(RecordSink):
    """Appends records as JSON lines on the export thread (file rotated by size)."""

    name = "events-jsonl"

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, backups: int) -> None:
        self.file = RotatingFile(path, max_bytes, backups)
        self.closed = False
        self.dropped_after_close = 0
        self._lock = threading.Lock()

    def write_records(self, records: Sequence[Any], timeout_s: float) -> None:
        """Append ``records``, one JSON object per line, in one write."""
        text = "".join(json_bytes(r).decode("utf-8") + "\n" for r in records)
        with self._lock:
            if self.closed:
                self.dropped_after_close += len(records)
                return
            self.file.write(text)

    def after_fork_in_child(self) -> None:
        """A forked child writes ``<stem>.<pid><suffix>``."""
        self._lock = threading.Lock()
        self.file.after_fork_in_child()

    def close(self) -> None:
        """Close the file; records arriving later are counted, not written."""
        with self._lock:
            self.closed = True
            self.file.close()


_channel_ids = itertools.count(1)


class JsonlHandler(logging.Handler):
    """A ``logging`` handler writing JSON lines through the metrics pipeline (no caller I/O)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        level: int | str = logging.NOTSET,
        max_bytes: int = 64 << 20,
        backups: int = 3,
        pipeline: Pipeline | None = None,
    ) -> None:
        super().__init__(level)
        self.sink = JsonlSink(path, max_bytes, backups)
        self.pipeline = get_pipeline() if pipeline is None else pipeline
        self.channel: Channel = self.pipeline.open_channel(
            f"events-jsonl-{next(_channel_ids)}", self.sink
        )

    @property
    def path(self) -> Path:
        """The file written now."""
        return self.sink.file.path

    @property
    def dropped(self) -> int:
        """Records lost because the ring was full, or because they came after ``close``."""
        return self.pipeline.ring.dropped(self.channel.drop_key) + self.sink.dropped_after_close

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        """Filter and emit, without the handler lock (the channel is thread-safe)."""
        rv = self.filter(record)
        if isinstance(rv, logging.LogRecord):
            record = rv
        if rv:
            self.emit(record)
        return bool(rv)

    def emit(self, record: logging.LogRecord) -> None:
        """Queue the record's JSON object for the export thread."""
        try:
            self.channel.put(as_json_object(record, self.formatter))
        except Exception:
            self.handleError(record)

    def flush(self, timeout_s: float | None = 10.0) -> None:
        """Wait until what was queued so far is in the file."""
        self.pipeline.flush(timeout_s)

    def close(self) -> None:
        """Write what is queued, close the channel and the file (later records count as dropped)."""
        if not self.pipeline.closed:
            self.pipeline.close_channel(self.channel.name)
        self.sink.close()
        super().close()


def log_to_jsonl(
    path: str | os.PathLike[str],
    *,
    level: int | str = logging.INFO,
    logger: logging.Logger | str | None = None,
    max_bytes: int = 64 << 20,
    backups: int = 3,
    pipeline: Pipeline | None = None,
) -> JsonlHandler:
    """Send events (of ``level`` and above) to a JSON-lines file; returns the handler.

    The logger (``stepscope.events`` by default) is lowered to ``level`` if it was higher.
    Remove the handler with ``logger.removeHandler(handler); handler.close()``.
    """
    handler = JsonlHandler(
        path, level=level, max_bytes=max_bytes, backups=backups, pipeline=pipeline
    )
    target = resolve_logger(logger)
    target.addHandler(handler)
    if target.getEffectiveLevel() > handler.level:
        target.setLevel(handler.level)
    return handler
