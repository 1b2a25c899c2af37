"""The ``python`` collector: every Python function call in a window as ``python_function`` spans.

Spans are named like torch's (``file(line): qualname``, paths relative to ``sys.path``) with args
``Python id`` / ``Python parent id``.  The C tracer in ``stepscope._native`` does the recording:
through ``sys.monitoring`` on Python 3.12+ (on a free tool id: 4, 3 or 5, never cProfile's 2),
through a chained profile function on 3.10/3.11.  Without the extension, the pure-Python twin
(:mod:`stepscope.collectors.python_twin`) records the same spans, slower.  Nothing is installed
outside ``start``..``stop``.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from types import CodeType, FunctionType, ModuleType
from typing import Any

from stepscope import clock
from stepscope._ext import NativeModule, resolve
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.python_common import (
    DEFAULT_BUFFER_BYTES,
    ModuleFilter,
    SourceNames,
    TracerOptions,
    add_python_spans,
    fill_span_columns,
    name_ids_for,
)
from stepscope.collectors.python_twin import TwinTracer
from stepscope.failures import failure_log
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import hidden_threads

__all__ = ["PythonTracerCollector"]

log = logging.getLogger("stepscope")
_failures = failure_log("collectors")

TOOL_NAME = "stepscope"
TOOL_IDS = (4, 3, 5)
"""sys.monitoring tool ids tried in order (0 debugger, 1 coverage, 2 profiler are left alone)."""
METADATA_KEY = "stepscope_python_tracer"

_owner: PythonTracerCollector | None = None
_owner_lock = threading.Lock()
_filters_at_restart: dict[int, tuple[Any, ...]] = {}
"""Per tool id: filters of stepscope's last use (DISABLEd code stays disabled until a restart)."""


def _codes_of(namespace: ModuleType | type) -> list[CodeType]:
    codes: list[CodeType] = []
    for value in vars(namespace).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property) and value.fget is not None:
            value = value.fget
        if isinstance(value, FunctionType):
            codes.append(value.__code__)
        elif isinstance(value, type) and value.__module__ == __name__:
            codes.extend(_codes_of(value))
    return codes


def _own_codes() -> tuple[CodeType, ...]:
    """This module's functions run inside the window; they are never recorded."""
    return tuple(_codes_of(sys.modules[__name__]))


class _MonitoringHooks:
    """Registers the C callbacks with sys.monitoring (3.12+) on a free tool id."""

    def __init__(self, mod: NativeModule, trace_c: bool) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined]
        events = mon.events
        self.callbacks = {
            events.PY_START: mod._mon_py_start,
            events.PY_RESUME: mod._mon_py_start,
            events.PY_RETURN: mod._mon_py_return,
            events.PY_YIELD: mod._mon_py_return,
            events.PY_UNWIND: mod._mon_py_unwind,
            events.PY_THROW: mod._mon_py_throw,
        }
        if trace_c:
            self.callbacks[events.CALL] = mod._mon_call
            self.callbacks[events.C_RETURN] = mod._mon_c_end
            self.callbacks[events.C_RAISE] = mod._mon_c_end
        self.tool: int | None = None

    @staticmethod
    def claim_tool() -> int:
        """Take the first free tool id of ``TOOL_IDS``."""
        mon = sys.monitoring  # type: ignore[attr-defined]
        for tool in TOOL_IDS:
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, TOOL_NAME)
                return tool
        taken = ", ".join(f"{t}={mon.get_tool(t)!r}" for t in TOOL_IDS)
        raise RuntimeError(f"no free sys.monitoring tool id for the function tracer ({taken})")

    def install(self, filter_key: tuple[Any, ...]) -> None:
        """Claim a tool id, register the callbacks, turn the events on."""
        mon = sys.monitoring  # type: ignore[attr-defined]
        tool = self.tool = self.claim_tool()
        if _filters_at_restart.get(tool) != filter_key:
            # Code DISABLEd under other filters (or by the id's previous user) must fire again.
            mon.restart_events()
            _filters_at_restart[tool] = filter_key
        mask = 0
        for event, callback in self.callbacks.items():
            mon.register_callback(tool, event, callback)
            mask |= event
        mon.set_events(tool, mask)

    def remove(self) -> None:
        """Turn the events off, unregister, and free the tool id (only if it is still ours)."""
        tool = self.tool
        if tool is None:
            return
        self.tool = None
        mon = sys.monitoring  # type: ignore[attr-defined]
        if mon.get_tool(tool) != TOOL_NAME:
            return
        mon.set_events(tool, 0)
        for event in self.callbacks:
            mon.register_callback(tool, event, None)
        mon.free_tool_id(tool)


class _NativeTracer:
    """The C tracer behind the same interface as :class:`TwinTracer`."""

    def __init__(self, mod: NativeModule) -> None:
        self.mod = mod
        self.monitoring = sys.version_info >= (3, 12)
        self.implementation = "c-monitoring" if self.monitoring else "c-profile"
        self._hooks: _MonitoringHooks | None = None
        self._prev_thread_hook: Any = None

    def configure(self, options: TracerOptions, filt: ModuleFilter | None) -> None:
        min_ticks = math.ceil(options.min_duration_ns * float(self.mod.ticks_per_second()) / 1e9)
        self.mod._tracer_configure(
            max_depth=options.depth_limit,
            min_ticks=min_ticks,
            trace_c=options.trace_c_functions,
            drop_oldest=options.drop_policy == "oldest",
            budget=options.budget,
            filter=filt,
            ignore=_own_codes(),
            disable=sys.monitoring.DISABLE if self.monitoring else None,  # type: ignore[attr-defined]
            native_ids={
                t.ident: t.native_id
                for t in threading.enumerate()
                if t.ident is not None and t.native_id is not None
            },
            tsc=clock.SOURCE == "tsc",
            hidden=hidden_threads,
        )
        self._options = options

    def start(self) -> None:
        mod = self.mod
        if self.monitoring:
            hooks = _MonitoringHooks(mod, self._options.trace_c_functions)
            mod._tracer_start("monitoring")
            try:
                hooks.install(self._options.filter_key())
            except BaseException:
                hooks.remove()
                mod._tracer_stop()
                raise
            self._hooks = hooks
        else:
            # New threads first, so no Python runs between this and the tracer's start.
            self._prev_thread_hook = threading.getprofile()
            threading.setprofile(mod._tracer_thread_hook)
            try:
                mod._tracer_start("profile")
            except BaseException:
                threading.setprofile(self._prev_thread_hook)
                raise

    def stop(self) -> dict[str, Any]:
        # The tracer first (it ignores every event from then on), then the hooks.
        stats: dict[str, Any] = dict(self.mod._tracer_stop())
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        else:
            threading.setprofile(self._prev_thread_hook)
            self._prev_thread_hook = None
        return stats

    def interned(self) -> list[CodeType | str | None]:
        return self.mod._tracer_interned()

    def count(self) -> int:
        return int(self.mod._tracer_stats()["events"])

    def export(
        self, name_ids: Any, first_id: int, first_row: int, cols: Any
    ) -> tuple[bytes, list[int]]:
        return self.mod._tracer_export(name_ids, first_id, first_row, *cols)

    def clear(self) -> None:
        self.mod._tracer_clear()


class _TwinAdapter:
    """The pure-Python twin, configured from options like the native tracer."""

    implementation = "python"

    def __init__(self) -> None:
        self.twin = TwinTracer()

    def configure(self, options: TracerOptions, filt: ModuleFilter | None) -> None:
        self.twin.configure(
            max_depth=options.depth_limit,
            min_ticks=options.min_duration_ns,
            trace_c=options.trace_c_functions,
            drop_oldest=options.drop_policy == "oldest",
            budget=options.budget,
            filter=filt,
            ignore=_own_codes(),
            hidden=hidden_threads,
        )

    def start(self) -> None:
        self.twin.start()

    def stop(self) -> dict[str, Any]:
        return self.twin.stop()

    def interned(self) -> list[CodeType | str | None]:
        return self.twin.interned()

    def count(self) -> int:
        return int(self.twin.stats()["events"])

    def export(
        self, name_ids: Any, first_id: int, first_row: int, cols: Any
    ) -> tuple[bytes, list[int]]:
        return fill_span_columns(self.twin.export(name_ids, first_id, first_row), cols)

    def clear(self) -> None:
        self.twin.clear()


class PythonTracerCollector(Collector):
    """Records every Python function call of a window (``with_stack=True``)."""

    name = "python"

    def __init__(
        self,
        *,
        max_depth: int | None = None,
        include: tuple[str, ...] | list[str] = (),
        exclude: tuple[str, ...] | list[str] = (),
        min_duration_ns: int = 0,
        trace_c_functions: bool = False,
        event_budget: int | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        drop_policy: str = "oldest",
        implementation: str = "auto",
        strict: bool | None = None,
    ) -> None:
        self.options = TracerOptions(
            max_depth=max_depth,
            include=include,  # type: ignore[arg-type]  # validated and converted there
            exclude=exclude,  # type: ignore[arg-type]
            min_duration_ns=min_duration_ns,
            trace_c_functions=bool(trace_c_functions),
            event_budget=event_budget,
            buffer_bytes=buffer_bytes,
            drop_policy=drop_policy,
        )
        mod = resolve(implementation)
        self.strict = strict
        self._backend: _NativeTracer | _TwinAdapter = (
            _NativeTracer(mod) if mod is not None else _TwinAdapter()
        )
        self._state = "idle"  # idle -> prepared -> recording -> stopped -> (collect) idle
        self._stats: dict[str, Any] = {}
        self._failure: str | None = None
        self._warned: set[str] = set()

    @property
    def implementation(self) -> str:
        """Which tracer records: ``c-monitoring``, ``c-profile`` or ``python``."""
        return self._backend.implementation

    # -- lifecycle ---------------------------------------------------------------------------
    def prepare(self, ctx: WindowContext) -> None:
        """Claim the tracer and set its filters and budget for the coming window."""
        global _owner
        if self._state in ("recording",):
            return
        with _owner_lock:
            if _owner is not None and _owner is not self:
                raise RuntimeError(
                    "another PythonTracerCollector is using the function tracer; "
                    "only one profile may trace Python calls at a time"
                )
            _owner = self
        self._names = SourceNames()
        opts = self.options
        filt = ModuleFilter(opts.include, opts.exclude, self._names)
        self._backend.configure(opts, filt if filt.active else None)
        self._state = "prepared"
        self._failure = None

    def start(self, ctx: WindowContext) -> None:
        """Start tracing every thread."""
        if self._state == "recording":
            return
        if self._state != "prepared":
            self.prepare(ctx)
        try:
            self._backend.start()
        except Exception as exc:
            _failures.report(
                "tracer_error",
                "the Python function tracer's start",
                exc,
                strict=self.strict,
                then="Python function tracing is off for this window",
                once=(id(self), "start"),
            )
            self._failure = f"{type(exc).__name__}: {exc}"
            self._state = "stopped"
            self._stats = {}
            return
        self._state = "recording"

    def stop(self, ctx: WindowContext) -> None:
        """Stop tracing; frames still running are closed at the window end (flagged in args)."""
        if self._state != "recording":
            return
        self._stats = self._backend.stop()
        self._state = "stopped"
        error = self._stats.get("first_filter_error")
        if error is not None:
            _failures.report(
                "tracer_error",
                "the function tracer's module filter",
                error,
                strict=self.strict,
                then="code it failed on was recorded",
                once=(id(self), "filter"),
            )

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append the window's spans to the trace, with what was dropped in its metadata."""
        if self._state == "recording":
            self.stop(ctx)
        if self._state != "stopped":
            return
        try:
            spans = 0
            if self._failure is None:
                name_ids = name_ids_for(builder, self._backend.interned(), self._names)
                backend = self._backend
                spans = add_python_spans(
                    builder,
                    ctx.pid,
                    backend.count(),
                    lambda row, cols: backend.export(name_ids, 1, row, cols),
                )
            self._report(ctx, spans)
        finally:
            self._release()

    def close(self) -> None:
        """Stop if still tracing and free every buffer."""
        if self._state == "recording":
            self._stats = self._backend.stop()
        if self._state != "idle":
            self._release()

    def after_fork_in_child(self) -> None:
        """Uninstall the tracer in a forked child and free the parent's buffers."""
        global _owner_lock
        _owner_lock = threading.Lock()  # another thread may have held it at the fork
        self.close()

    # -- helpers -----------------------------------------------------------------------------
    def _release(self) -> None:
        global _owner
        self._backend.clear()
        self._state = "idle"
        with _owner_lock:
            if _owner is self:
                _owner = None

    def _report(self, ctx: WindowContext, spans: int) -> None:
        stats = self._stats
        dropped = int(stats.get("dropped", 0))
        opts = self.options
        info: dict[str, Any] = {
            "implementation": self.implementation,
            "events": spans,
            "dropped_events": dropped,
            "event_budget": opts.budget,
            "drop_policy": opts.drop_policy,
        }
        if self._failure is not None:
            info["error"] = self._failure
        displaced = int(stats.get("displaced", 0))
        if displaced:
            info["displaced_threads"] = displaced
            self._notice_once(
                "displaced",
                f"stepscope: another profiler replaced the function tracer on {displaced} "
                "thread(s) during the window; calls after that are missing there",
            )
        ctx.metadata[METADATA_KEY] = info
        if dropped:
            ctx.summary.append(
                f"python tracer dropped {dropped} calls (budget {opts.budget} per window, "
                f"{opts.drop_policy} dropped)"
            )
            self._notice_once(
                "dropped",
                f"stepscope: the function tracer dropped {dropped} calls over its budget of "
                f"{opts.budget} (drop_policy={opts.drop_policy!r}); raise event_budget or "
                "buffer_bytes, or narrow it with include/exclude/max_depth/min_duration_ns",
            )

    def _notice_once(self, key: str, message: str) -> None:
        """Warn once per collector about data lost by design (budget, displaced): not a failure."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
