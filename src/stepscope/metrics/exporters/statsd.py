"""StatsD and DogStatsD over UDP, aggregated per export interval and packed into datagrams.

Per interval each series sends at most one line: counters their increase (``|c``), gauges
and scalars their value when it changed (``|g``), histograms and seed-API summaries the
increase of their count and sum (``.count``/``.sum`` as ``|c``) and the interval mean
(``.avg`` as ``|g``).  Lines are packed, newline-separated, into datagrams of at most
``max_datagram`` bytes.  Labels become DogStatsD tags (``|#k:v``) or, for plain StatsD,
Graphite-style tags in the name (``name;k=v``).
"""

from __future__ import annotations

import math
import re
import socket
from typing import Literal

from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.exporters.rows import is_telemetry
from stepscope.metrics.exporters.scalar_steps import with_step_families
from stepscope.metrics.failures import report_failure
from stepscope.metrics.points import (
    ExpHistogramValue,
    ExportBatch,
    Family,
    HistogramValue,
    Labels,
    SummaryValue,
)
from stepscope.text import clean_text

__all__ = ["StatsdExporter", "pack"]

_UNSAFE = re.compile(r"[:|@#,;=\s\x00-\x1f\x7f]")
_MAX_LINE = 65000
"""Longest line sent (a UDP datagram holds at most 65,507 bytes); longer ones are skipped."""


def _clean(text: str) -> str:
    return _UNSAFE.sub("_", clean_text(text))


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _finite(value: object) -> bool:
    try:
        return math.isfinite(value)  # type: ignore[arg-type]
    except (TypeError, OverflowError):
        return False


def pack(lines: list[str], max_datagram: int) -> list[bytes]:
    """Newline-joined datagrams of at most ``max_datagram`` bytes (a longer line goes alone)."""
    out: list[bytes] = []
    current = b""
    for line in lines:
        raw = line.encode()
        if current and len(current) + 1 + len(raw) > max_datagram:
            out.append(current)
            current = b""
        current = raw if not current else current + b"\n" + raw
    if current:
        out.append(current)
    return out


class StatsdExporter(Exporter):
    """Sends aggregated lines to a StatsD (``flavor="statsd"``) or DogStatsD agent."""

    name = "statsd"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8125,
        *,
        prefix: str = "",
        flavor: Literal["statsd", "dogstatsd"] = "dogstatsd",
        max_datagram: int = 1432,
        include_telemetry: bool = False,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise TypeError(f"host must be a non-empty str, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
            raise ValueError(f"port must be an int in [1, 65535], got {port!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        if flavor not in ("statsd", "dogstatsd"):
            raise ValueError(f"flavor must be 'statsd' or 'dogstatsd', got {flavor!r}")
        if isinstance(max_datagram, bool) or not isinstance(max_datagram, int) or max_datagram < 64:
            raise ValueError(f"max_datagram must be an int >= 64, got {max_datagram!r}")
        self.address = (host, port)
        self.prefix = prefix
        self.flavor = flavor
        self.max_datagram = max_datagram
        self.include_telemetry = include_telemetry
        self.datagrams_sent = 0
        self.lines_skipped = 0
        """Lines not sent: a NaN/inf/huge value, or a line too long for a datagram."""
        self._sock: socket.socket | None = None
        self._last: dict[tuple[str, Labels], tuple[float, float]] = {}

    def _line(self, name: str, labels: Labels, value: float, kind: str) -> str:
        if not _finite(value):
            return self._skip(name, ValueError(f"value {value!r} is not a finite number"))
        metric = _clean(f"{self.prefix}{name}")
        if self.flavor == "dogstatsd":
            tags = ",".join(f"{_clean(k)}:{_clean(v)}" for k, v in labels)
            return f"{metric}:{_number(value)}|{kind}" + (f"|#{tags}" if tags else "")
        tags = "".join(f";{_clean(k)}={_clean(v)}" for k, v in labels)
        return f"{metric}{tags}:{_number(value)}|{kind}"

    def _skip(self, name: str, exc: Exception) -> str:
        self.lines_skipped += 1
        report_failure("invalid_value", f"statsd series {clean_text(name)!r}", exc)
        return ""

    def lines(
        self, batch: ExportBatch
    ) -> tuple[list[str], dict[tuple[str, Labels], tuple[float, float]]]:
        """The lines for ``batch`` and the state to remember once they are sent."""
        out: list[str] = []
        state: dict[tuple[str, Labels], tuple[float, float]] = {}
        for family in with_step_families(batch.families):
            if is_telemetry(family.name) and not self.include_telemetry:
                continue
            self._family_lines(family, out, state)
        kept = []
        for line in out:
            if len(line.encode()) > _MAX_LINE:
                self._skip(line[:64], ValueError(f"a {len(line)}-character line is too long"))
            elif line:
                kept.append(line)
        return kept, state

    def _family_lines(
        self,
        family: Family,
        out: list[str],
        state: dict[tuple[str, Labels], tuple[float, float]],
    ) -> None:
        for point in family.points:
            key = (family.name, point.labels)
            before = self._last.get(key)
            value = point.value
            if family.kind == "counter" and isinstance(value, (int, float)):
                delta = value - (before[0] if before else 0.0)
                state[key] = (value, 0.0)
                if delta > 0:
                    out.append(self._line(family.name, point.labels, delta, "c"))
            elif isinstance(value, (HistogramValue, ExpHistogramValue, SummaryValue)):
                count_delta = value.count - (before[0] if before else 0)
                sum_delta = value.sum - (before[1] if before else 0.0)
                state[key] = (float(value.count), value.sum)
                if count_delta > 0:
                    out.append(self._line(f"{family.name}.count", point.labels, count_delta, "c"))
                    out.append(self._line(f"{family.name}.sum", point.labels, sum_delta, "c"))
                    out.append(
                        self._line(f"{family.name}.avg", point.labels, sum_delta / count_delta, "g")
                    )
            elif isinstance(value, (int, float)):
                state[key] = (value, 0.0)
                if before is None or before[0] != value:
                    out.append(self._line(family.name, point.labels, value, "g"))

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Send this interval's lines."""
        lines, state = self.lines(batch)
        if lines:
            sock = self._sock
            if sock is None:
                sock = self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.settimeout(timeout_s)
            for datagram in pack(lines, self.max_datagram):
                sock.sendto(datagram, self.address)
                self.datagrams_sent += 1
        self._last.update(state)

    def after_fork_in_child(self) -> None:
        """A forked child sends only its own increases, on its own socket."""
        self._sock = None
        self._last = {}
        self.datagrams_sent = 0

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
