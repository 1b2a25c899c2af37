"""``ExecutionTraceObserver``: torch's execution-trace interface for any program.

With torch imported when the callback is registered, the work is delegated to torch's observer,
which writes the Chakra execution trace of every torch operator in the profiled windows.
Without torch, the observer writes the call graph of the spans stepscope recorded in those
windows (Python functions, annotations) in the same JSON shape: ``nodes`` with ``id``, ``name``,
``ctrl_deps`` (the parent node), ``inputs``/``outputs`` and ``attrs``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from stepscope import clock
from stepscope.atomic import atomic_output, ensure_parent
from stepscope.collectors.base import Collector, WindowContext
from stepscope.jsonenc import json_bytes
from stepscope.trace.model import Trace
from stepscope.trace.nesting import nest_spans

__all__ = ["ExecutionTraceCollector", "ExecutionTraceObserver"]

SCHEMA = "1.1.1-chakra.0.0.4"
ROOT_NAME = "[pytorch|profiler|execution_trace|process]"


def _attr(name: str, kind: str, value: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "value": value}


def _empty_values() -> dict[str, list[Any]]:
    return {"values": [], "shapes": [], "types": []}


class ExecutionTraceObserver:
    """Records an execution trace for the same windows as the profile it is given to."""

    def __init__(self) -> None:
        self._registered = False
        self._running = False
        self._output_file_path = ""
        self._torch_observer: Any = None
        self._nodes: list[dict[str, Any]] = []
        self._start_ts = 0

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.unregister_callback()

    def register_callback(self, output_file_path: str) -> ExecutionTraceObserver:
        """Register the observer to write to ``output_file_path`` (once; later calls are no-ops)."""
        if self._registered:
            return self
        if not isinstance(output_file_path, str) or not output_file_path:
            raise ValueError(
                f"output_file_path must be a non-empty path string, got {output_file_path!r}"
            )
        ensure_parent(output_file_path, "execution trace")
        self._output_file_path = output_file_path
        if "torch" in sys.modules:
            from torch.profiler import ExecutionTraceObserver as TorchObserver

            self._torch_observer = TorchObserver().register_callback(output_file_path)
        self._registered = True
        return self

    def unregister_callback(self) -> None:
        """Stop, write the output file and detach."""
        if not self._registered:
            return
        self.stop()
        if self._torch_observer is not None:
            self._torch_observer.unregister_callback()
            self._torch_observer = None
        else:
            self._write()
        self._registered = False

    @property
    def is_registered(self) -> bool:
        """Whether ``register_callback`` has been called (and not undone)."""
        return self._registered

    def is_running(self) -> bool:
        """Whether the observer is recording now."""
        return self._running

    def start(self) -> None:
        """Begin recording (called by the profile when a window starts recording)."""
        if self._registered and not self._running:
            if self._torch_observer is not None:
                self._torch_observer.start()
            elif not self._start_ts:
                self._start_ts = clock.to_unix_ns(clock.now_ns())
            self._running = True

    def stop(self) -> None:
        """Stop recording (called by the profile when the window stops)."""
        if self._running:
            if self._torch_observer is not None:
                self._torch_observer.stop()
            self._running = False

    def cleanup(self) -> None:
        """Finish: same as ``unregister_callback``."""
        self.unregister_callback()

    def get_output_file_path(self) -> str:
        """The output path; an error before ``register_callback``."""
        if self.is_registered:
            return self._output_file_path
        raise RuntimeError(
            "A callback to the execution trace observer needs to be registered first "
            "(register_callback(path)) before getting the output file path"
        )

    @property
    def delegates_to_torch(self) -> bool:
        """Whether torch's own observer does the recording."""
        return self._torch_observer is not None

    def add_window(self, trace: Trace) -> None:
        """Add a recorded window's spans as call-graph nodes (used when torch is absent)."""
        if not self._registered or self._torch_observer is not None:
            return
        if not self._nodes:
            self._nodes.append(
                {
                    "id": 1,
                    "name": ROOT_NAME,
                    "ctrl_deps": 0,
                    "inputs": _empty_values(),
                    "outputs": _empty_values(),
                    "attrs": [_attr("rf_id", "uint64", 0)],
                }
            )
        nesting = nest_spans(trace)
        first_id = len(self._nodes) + 1
        for i, span in enumerate(trace.iter_spans()):
            parent = nesting.parent[i]
            self._nodes.append(
                {
                    "id": first_id + i,
                    "name": span.name,
                    "ctrl_deps": first_id + parent if parent >= 0 else 1,
                    "inputs": _empty_values(),
                    "outputs": _empty_values(),
                    "attrs": [
                        _attr("rf_id", "uint64", first_id + i),
                        _attr("category", "string", span.cat),
                        _attr("tid", "uint64", span.tid),
                        _attr("start_ns", "uint64", span.start_ns + trace.base_time_ns),
                        _attr("dur_ns", "uint64", span.dur_ns),
                    ],
                }
            )

    def _write(self) -> None:
        doc = {
            "schema": SCHEMA,
            "pid": os.getpid(),
            "time": clock.to_unix_ns(clock.now_ns()),
            "start_ts": self._start_ts,
            "nodes": self._nodes,
            "finish_ts": clock.to_unix_ns(clock.now_ns()),
        }
        with atomic_output(self._output_file_path, what="execution trace") as fh:
            fh.write(json_bytes(doc))
        self._nodes = []


class ExecutionTraceCollector(Collector):
    """Drives an execution-trace observer from the profile's windows, like any collector."""

    name = "execution_trace"

    def __init__(self, observer: Any) -> None:
        for method in ("start", "stop", "cleanup"):
            if not callable(getattr(observer, method, None)):
                raise TypeError(
                    "execution_trace_observer must be an ExecutionTraceObserver (with start, "
                    f"stop and cleanup), got {observer!r}"
                )
        self.observer = observer

    def start(self, ctx: WindowContext) -> None:
        """Start the observer with the window."""
        self.observer.start()

    def stop(self, ctx: WindowContext) -> None:
        """Stop the observer with the window."""
        self.observer.stop()

    def window_built(self, trace: Trace) -> None:
        """Without torch, the window's spans become call-graph nodes."""
        if isinstance(self.observer, ExecutionTraceObserver):
            self.observer.add_window(trace)

    def close(self) -> None:
        """Write the observer's file and detach it (the profile is done)."""
        self.observer.cleanup()
