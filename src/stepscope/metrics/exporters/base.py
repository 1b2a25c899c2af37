"""The exporter interface: what the export thread calls with each batch."""

from __future__ import annotations

import abc

from stepscope.metrics.points import ExportBatch

__all__ = ["Exporter"]


class Exporter(abc.ABC):
    """Receives every export batch on the export thread; raising means the delivery failed.

    A failed delivery is retried with backoff; when the backend stays down, the batch's scalar
    points and records go to the pipeline's spill file instead.
    """

    name: str = "exporter"

    @abc.abstractmethod
    def export(self, batch: ExportBatch, timeout_s: float) -> None:
        """Deliver ``batch`` within ``timeout_s`` seconds or raise."""

    def after_fork_in_child(self) -> None:  # noqa: B027 - optional hook
        """Reset per-process state (sockets, files, servers) in a forked child."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once after the final batch."""
