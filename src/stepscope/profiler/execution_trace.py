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
import tempfile
import warnings
from typing import Any

from stepscope import clock
from stepscope.atomic import atomic_output, ensure_parent
from stepscope.collectors.base import Collector, WindowContext
from stepscope.jsonenc import json_bytes
from stepscope.trace.model import Trace
from stepscope.trace.nesting import nest_spans

__all__ = ["ExecutionTraceCollector", "ExecutionTraceObserver"]

SCHEMA = "1.1.1-chakra.0.0.4"
ENV_ENABLE = "ENABLE_PYTORCH_EXECUTION_TRACE"
ENV_EXTRAS = "ENABLE_PYTORCH_EXECUTION_TRACE_EXTRAS"
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
        self.extra_resources_collection = False
        """Whether the files that make the trace replayable (generated kernels) are kept in
        ``get_resources_dir()``."""
        self.resources_dir = ""

    @staticmethod
    def build_execution_trace_obs_from_env() -> ExecutionTraceObserver | None:
        """An observer writing to a new temporary file when ``ENABLE_PYTORCH_EXECUTION_TRACE=1``
        (with extra resources when ``ENABLE_PYTORCH_EXECUTION_TRACE_EXTRAS=1``), else None."""
        if os.environ.get(ENV_ENABLE, "0") != "1":
            return None
        try:
            fd, path = tempfile.mkstemp(suffix=".et.json")
            os.close(fd)
        except OSError as exc:
            warnings.warn(
                f"{ENV_ENABLE}=1 but no temporary file for the execution trace could be made "
                f"({exc}); set TMPDIR to a writable folder",
                stacklevel=2,
            )
            return None
        observer = ExecutionTraceObserver().register_callback(path)
        observer.set_extra_resource_collection(os.environ.get(ENV_EXTRAS, "0") == "1")
        return observer

    def set_extra_resource_collection(self, val: bool) -> None:
        """Keep the generated kernels and other replay resources next to the trace file."""
        self.extra_resources_collection = bool(val)
        if self._torch_observer is not None:
            self._torch_observer.set_extra_resource_collection(self.extra_resources_collection)
        if self.extra_resources_collection:
            self.get_resources_dir(can_create=True)

    def get_resources_dir(self, can_create: bool = False) -> str | None:
        """The folder of the replay resources (``<trace name>_resources`` beside the trace), or
        None without ``set_extra_resource_collection(True)`` or when it cannot be made."""
        if self._torch_observer is not None:
            found: str | None = self._torch_observer.get_resources_dir(can_create=can_create)
            return found
        if not self.extra_resources_collection:
            return None
        if not self.resources_dir:
            made = self.get_resources_dir_for_et_path(self._output_file_path, can_create)
            if made is None:
                return None
            self.resources_dir = made
        return self.resources_dir

    @staticmethod
    def get_resources_dir_for_et_path(trace_path: str, create_dir: bool = False) -> str | None:
        """``<trace name>_resources`` beside ``trace_path`` if it exists (or was made)."""
        folder, name = os.path.split(trace_path)
        resources = os.path.join(folder, os.path.splitext(name)[0] + "_resources")
        if os.path.isdir(resources):
            return resources
        if not create_dir:
            return None
        try:
            os.mkdir(resources)
        except OSError as exc:
            warnings.warn(
                f"the execution trace resources folder {resources} could not be made ({exc})",
                stacklevel=2,
            )
            return None
        return resources

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
            if self.extra_resources_collection:
                self._torch_observer.set_extra_resource_collection(True)
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

    @property
    def _execution_trace_running(self) -> bool:
        """torch's name of ``is_running()`` (torch's own tests read it)."""
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
        """The output path (also once unregistered); an error before ``register_callback``."""
        if self._output_file_path:
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
    collects_off_loop = True  # collects nothing

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
