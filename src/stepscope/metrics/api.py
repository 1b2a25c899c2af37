"""The torchelastic metrics API (``torch.distributed.elastic.metrics``), same names and behaviour.

Differences, all bug fixes: a handler that raises never turns a successful call into a failure
or an exception (the error is counted and logged once); ``@prof`` measures with the monotonic
clock (``.duration.ms`` stays integer milliseconds for handlers written for the old API, while
:class:`~stepscope.metrics.pipeline.PipelineMetricHandler` keeps nanosecond resolution);
``getStream`` returns a cached stream instead of allocating one per call.
"""

from __future__ import annotations

import abc
import warnings
from collections import namedtuple
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, overload

from stepscope.clock import now_ns, to_unix_ns
from stepscope.metrics.failures import report_failure

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "MetricStream",
    "MetricsConfig",
    "NullMetricHandler",
    "configure",
    "getStream",
    "get_elapsed_time_ms",
    "prof",
    "publish_metric",
    "put_metric",
]

MetricData = namedtuple("MetricData", ["timestamp", "group_name", "name", "value"])
MetricData.__doc__ = "One metric value: Unix time in seconds, group, name and value."

F = TypeVar("F", bound=Callable[..., Any])

_CACHE_LIMIT = 4096


def _wall_seconds() -> float:
    return to_unix_ns(now_ns()) / 1e9


class MetricsConfig:
    """Free-form parameters for a metrics backend."""

    __slots__ = ("params",)

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params: dict[str, str] = {} if params is None else params


class MetricHandler(abc.ABC):
    """Receives every metric value of the groups it is configured for."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None:
        """Handle one value."""

    def emit_elapsed(self, group_name: str | None, metric_name: str, elapsed_ns: int) -> None:
        """Handle a duration measured by ``@prof``; by default integer ms through :meth:`emit`."""
        self.emit(MetricData(_wall_seconds(), group_name, metric_name, elapsed_ns // 1_000_000))


class ConsoleMetricHandler(MetricHandler):
    """Prints ``[timestamp][group]: name=value`` for every value."""

    def emit(self, metric_data: MetricData) -> None:
        """Print one value."""
        print(
            f"[{metric_data.timestamp}][{metric_data.group_name}]: "
            f"{metric_data.name}={metric_data.value}"
        )


class NullMetricHandler(MetricHandler):
    """Discards every value (the default)."""

    def emit(self, metric_data: MetricData) -> None:
        """Discard one value."""


def _emit(handler: MetricHandler, data: MetricData) -> None:
    try:
        handler.emit(data)
    except Exception as exc:
        report_failure("handler_error", f"{type(handler).__name__}.emit", exc)


def _emit_elapsed(handler: MetricHandler, group: str | None, name: str, elapsed_ns: int) -> None:
    try:
        emit_elapsed = getattr(handler, "emit_elapsed", None)
        if emit_elapsed is None:
            handler.emit(MetricData(_wall_seconds(), group, name, elapsed_ns // 1_000_000))
        else:
            emit_elapsed(group, name, elapsed_ns)
    except Exception as exc:
        report_failure("handler_error", f"{type(handler).__name__}.emit", exc)


class MetricStream:
    """The values of one group, sent to one handler."""

    __slots__ = ("group_name", "handler")

    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int) -> None:
        """Send one value to the handler."""
        handler = self.handler
        if handler.__class__ is not NullMetricHandler:
            _emit(handler, MetricData(_wall_seconds(), self.group_name, metric_name, metric_value))

    def add_elapsed(self, metric_name: str, elapsed_ns: int) -> None:
        """Send a duration measured by ``@prof`` (integer ms through ``emit`` by default)."""
        handler = self.handler
        if handler.__class__ is not NullMetricHandler:
            _emit_elapsed(handler, self.group_name, metric_name, elapsed_ns)


_metrics_map: dict[str | None, MetricHandler] = {}
_default_metrics_handler: MetricHandler = NullMetricHandler()
_streams: dict[str | None, MetricStream] = {}


def configure(handler: MetricHandler, group: str | None = None) -> None:
    """Send the values of ``group`` (every group without a handler when None) to ``handler``."""
    global _default_metrics_handler
    if not callable(getattr(handler, "emit", None)):
        raise TypeError(
            f"handler must be a MetricHandler (an object with an emit(metric_data) method), "
            f"got {type(handler).__name__}"
        )
    if group is None:
        _default_metrics_handler = handler
    else:
        _metrics_map[group] = handler
    _streams.clear()


def getStream(group: str) -> MetricStream:
    """The stream of ``group`` (cached: one per group until ``configure`` changes handlers)."""
    stream = _streams.get(group)
    if stream is None:
        stream = MetricStream(group, _metrics_map.get(group, _default_metrics_handler))
        if len(_streams) < _CACHE_LIMIT:
            _streams[group] = stream
    return stream


def put_metric(metric_name: str, metric_value: int, metric_group: str = "torchelastic") -> None:
    """Publish one value of ``metric_name`` in ``metric_group`` (through ``getStream``)."""
    getStream(metric_group).add_value(metric_name, metric_value)


def publish_metric(metric_group: str, metric_name: str, metric_value: int) -> None:
    """Deprecated: use ``put_metric(metric_name, metric_value, metric_group)``."""
    warnings.warn(
        "publish_metric is deprecated, use `put_metric(metric_name, metric_value, metric_group)`",
        FutureWarning,
        stacklevel=2,
    )
    getStream(metric_group).add_value(metric_name, metric_value)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Milliseconds since ``start_time_in_seconds`` (a Unix time such as ``time.time()``)."""
    return int((to_unix_ns(now_ns()) - start_time_in_seconds * 1e9) // 1_000_000)


def _get_metric_name(fn: Callable[..., Any]) -> str:
    qualname: str = fn.__qualname__
    parts = qualname.split(".")
    if len(parts) == 1:
        module = fn.__module__
        return f"{module.split('.')[-1]}.{parts[0]}" if module else parts[0]
    return qualname


def _finish(group: str | None, outcome: str | None, duration: str, start_ns: int) -> None:
    elapsed = now_ns() - start_ns
    stream = getStream(group)  # type: ignore[arg-type]  # looked up at each call, as torch's
    if stream.handler.__class__ is NullMetricHandler:
        return
    if outcome is not None:
        stream.add_value(outcome, 1)
    add_elapsed = getattr(stream, "add_elapsed", None)
    if add_elapsed is not None:
        add_elapsed(duration, elapsed)
    else:  # a stream of another kind (e.g. torch's own, patched in by a test)
        stream.add_value(duration, elapsed // 1_000_000)


def _instrument(f: F, group: str | None, key: str) -> F:
    success = f"{key}.success"
    failure = f"{key}.failure"
    duration = f"{key}.duration.ms"

    @wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = now_ns()
        try:
            result = f(*args, **kwargs)
        except Exception:
            _finish(group, failure, duration, start)
            raise
        except BaseException:
            _finish(group, None, duration, start)
            raise
        _finish(group, success, duration, start)
        return result

    return wrapper  # type: ignore[return-value]


@overload
def prof(fn: F, group: str = "torchelastic") -> F: ...
@overload
def prof(fn: None = None, group: str = "torchelastic") -> Callable[[F], F]: ...
def prof(fn: F | None = None, group: str = "torchelastic") -> F | Callable[[F], F]:
    """Decorator publishing ``<name>.success``/``.failure``/``.duration.ms`` for each call.

    ``<name>`` is ``Class.method`` for methods and ``leafmodule.function`` for top-level
    functions.  Use bare (``@prof``) or with a group (``@prof(group="agent")``).
    """

    def wrap(f: F) -> F:
        return _instrument(f, group, _get_metric_name(f))

    if fn:
        return wrap(fn)
    return wrap


def profile(group: str | None = None) -> Callable[[F], F]:
    """Deprecated: use ``@prof``; publishes ``<function>.success``/``failure``/``duration.ms``."""
    warnings.warn("profile is deprecated, use `@prof` instead", FutureWarning, stacklevel=2)

    def wrap(func: F) -> F:
        return _instrument(func, group, func.__name__)

    return wrap
