"""Helpers shared by the metrics tests (a collecting exporter, free ports, real servers)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.points import ExportBatch, Family
from stepscope.metrics.ring import RecordSink


class CollectingExporter(Exporter):
    """Keeps every batch it is given (an in-process backend)."""

    name = "collect"

    def __init__(self) -> None:
        self.batches: list[ExportBatch] = []
        self.closed = False
        self.lock = threading.Lock()

    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        with self.lock:
            self.batches.append(batch)

    def close(self) -> None:
        self.closed = True

    def family(self, name: str) -> Family:
        """The family ``name`` from the newest batch that has it."""
        for batch in reversed(self.batches):
            for family in batch.families:
                if family.name == name:
                    return family
        raise KeyError(name)

    def values(self, name: str) -> dict[tuple[tuple[str, str], ...], Any]:
        """Labels -> value of family ``name`` in the newest batch."""
        return {p.labels: p.value for p in self.family(name).points}

    def scalars(self) -> list[Any]:
        """Every scalar point delivered, in order."""
        return [s for b in self.batches for s in b.scalars]

    def records(self) -> list[Any]:
        """Every seed-API record delivered, in order."""
        return [r for b in self.batches for r in b.records]


class ListSink(RecordSink):
    """A channel sink that keeps the records it is given."""

    name = "list"

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.batches = 0

    def write_records(self, records: Sequence[Any], timeout_s: float) -> None:
        self.records.extend(records)
        self.batches += 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def udp_receiver() -> socket.socket:
    """A UDP socket on a free loopback port (a StatsD agent stand-in); close it when done."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    return sock


def received(sock: socket.socket) -> list[bytes]:
    """Every datagram that arrives until the socket times out."""
    out = []
    while True:
        try:
            out.append(sock.recv(65535))
        except TimeoutError:
            return out
