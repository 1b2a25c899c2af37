"""Python garbage collections as ``Python GC`` spans (torch's ``record_python_gc_info``)."""

from __future__ import annotations

import gc
import threading
from typing import Any

from stepscope import clock
from stepscope.collectors.annotations import emit_span
from stepscope.collectors.base import Collector, WindowContext

__all__ = ["GC_SPAN", "GcCollector"]

GC_SPAN = "Python GC"


class GcCollector(Collector):
    """Records each collection of the window as a ``Python GC`` span on the collecting thread."""

    name = "gc"
    collects_off_loop = True  # nothing to collect: its spans go through emit_span

    def __init__(self) -> None:
        self._starts: dict[int, int] = {}
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        tid = threading.get_native_id()
        if phase == "start":
            self._starts[tid] = clock.now_ns()
            return
        start = self._starts.pop(tid, None)
        if start is not None:
            emit_span(
                GC_SPAN,
                start,
                clock.now_ns(),
                {
                    "generation": info.get("generation"),
                    "collected": info.get("collected"),
                    "uncollectable": info.get("uncollectable"),
                },
            )

    def start(self, ctx: WindowContext) -> None:
        """Hook ``gc.callbacks`` for the window."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def stop(self, ctx: WindowContext) -> None:
        """Unhook ``gc.callbacks``."""
        self.close()

    def close(self) -> None:
        """Unhook ``gc.callbacks`` if still hooked."""
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False
        self._starts.clear()
