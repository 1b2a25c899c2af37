"""The seed-compatible face of stepscope.metrics (torchelastic's metrics API) and its bug fixes."""

from __future__ import annotations

import abc
import io
import logging
import time
import warnings
from contextlib import redirect_stdout

import pytest

from stepscope import clock
from stepscope.failures import set_strict
from stepscope.metrics import api
from stepscope.metrics.api import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    _get_metric_name,
    configure,
    get_elapsed_time_ms,
    getStream,
    prof,
    profile,
    publish_metric,
    put_metric,
)
from stepscope.metrics.failures import failure_counts

pytestmark = pytest.mark.implementation_independent


class RecordingHandler(MetricHandler):
    """Keeps every value by name (like torchelastic's test handler) and in order."""

    def __init__(self) -> None:
        self.metric_data: dict[str, MetricData] = {}
        self.seen: list[MetricData] = []

    def emit(self, metric_data: MetricData) -> None:
        self.metric_data[metric_data.name] = metric_data
        self.seen.append(metric_data)


class RaisingHandler(MetricHandler):
    def __init__(self) -> None:
        self.calls = 0

    def emit(self, metric_data: MetricData) -> None:
        self.calls += 1
        raise RuntimeError("backend is down")


def foo_1() -> None:
    pass


class Parent(abc.ABC):
    @abc.abstractmethod
    def func(self) -> None:
        raise NotImplementedError

    def base_func(self) -> None:
        self.func()


class Child(Parent):
    @prof
    def func(self) -> None:
        pass


class Service:
    def foo_2(self) -> None:
        pass

    @prof
    def bar(self) -> int:
        return 7

    @prof
    def throw(self) -> None:
        raise RuntimeError("boom")

    @prof(group="agent")
    def bar2(self) -> None:
        pass


def test_public_names_match_torchelastic() -> None:
    expected = {
        "MetricsConfig",
        "MetricHandler",
        "ConsoleMetricHandler",
        "NullMetricHandler",
        "MetricStream",
        "configure",
        "getStream",
        "prof",
        "put_metric",
        "publish_metric",
        "get_elapsed_time_ms",
        "MetricData",
    }
    assert expected <= set(api.__all__)
    # torchelastic's deprecated ``profile`` stays reachable but out of ``__all__``, so
    # ``from stepscope.metrics import *`` cannot shadow the profiler's ``profile``
    assert callable(api.profile) and "profile" not in api.__all__
    assert MetricData._fields == ("timestamp", "group_name", "name", "value")
    assert MetricsConfig().params == {}
    assert MetricsConfig({"a": "b"}).params == {"a": "b"}


def test_metric_name_is_class_method_or_leaf_module_function() -> None:
    foo_1.__module__ = "pkg.api_test"
    assert _get_metric_name(foo_1) == "api_test.foo_1"
    assert _get_metric_name(Service().foo_2) == "Service.foo_2"
    assert _get_metric_name(Service.bar) == "Service.bar"


def test_prof_publishes_success_failure_and_duration() -> None:
    handler = RecordingHandler()
    configure(handler, group="torchelastic")
    service = Service()
    assert service.bar() == 7
    assert handler.metric_data["Service.bar.success"].value == 1
    assert "Service.bar.failure" not in handler.metric_data
    assert "Service.bar.duration.ms" in handler.metric_data
    with pytest.raises(RuntimeError, match="boom"):
        service.throw()
    assert handler.metric_data["Service.throw.failure"].value == 1
    assert "Service.throw.success" not in handler.metric_data
    assert "Service.throw.duration.ms" in handler.metric_data
    # success/failure first, duration second (the order handlers saw in torchelastic)
    names = [d.name for d in handler.seen]
    assert names[:2] == ["Service.bar.success", "Service.bar.duration.ms"]


def test_prof_group_goes_to_that_groups_handler() -> None:
    default, agent = RecordingHandler(), RecordingHandler()
    configure(default)
    configure(agent, group="agent")
    Service().bar2()
    Service().bar()
    assert agent.metric_data["Service.bar2.success"].group_name == "agent"
    assert "Service.bar2.success" not in default.metric_data
    assert default.metric_data["Service.bar.success"].group_name == "torchelastic"


def test_prof_through_an_abstract_base_names_the_implementation() -> None:
    handler = RecordingHandler()
    configure(handler)
    Child().base_func()
    assert handler.metric_data["Child.func.success"].value == 1
    assert "Child.func.duration.ms" in handler.metric_data


def test_prof_keeps_function_metadata_and_passes_arguments() -> None:
    @prof
    def add(a: int, b: int = 2) -> int:
        """Adds."""
        return a + b

    assert add(1, b=5) == 6
    assert add.__name__ == "add"
    assert add.__doc__ == "Adds."


def test_put_metric_and_streams() -> None:
    handler = RecordingHandler()
    configure(handler, group="g")
    before = time.time()
    put_metric("m", 3, "g")
    after = time.time()
    data = handler.metric_data["m"]
    assert (data.group_name, data.name, data.value) == ("g", "m", 3)
    assert before - 0.01 <= data.timestamp <= after + 0.01
    put_metric("default_group", 1)  # group torchelastic -> default handler (Null): ignored
    assert "default_group" not in handler.metric_data
    stream = MetricStream("g", handler)
    stream.add_value("direct", 9)
    assert handler.metric_data["direct"].value == 9


def test_console_handler_prints_torchelastic_format() -> None:
    configure(ConsoleMetricHandler(), group="console")
    out = io.StringIO()
    with redirect_stdout(out):
        put_metric("loss", 5, "console")
    line = out.getvalue().strip()
    assert line.startswith("[") and line.endswith("][console]: loss=5")
    float(line[1 : line.index("]")])  # the timestamp is Unix seconds


def test_configure_rejects_a_non_handler() -> None:
    with pytest.raises(TypeError, match="MetricHandler"):
        configure("not a handler")  # type: ignore[arg-type]


def test_getStream_does_not_allocate_per_call_bug_fix() -> None:
    """Bug fix: torchelastic's getStream built a new MetricStream on every call."""
    handler = RecordingHandler()
    configure(handler, group="cached")
    first = getStream("cached")
    assert getStream("cached") is first
    assert first.handler is handler
    # configure() takes effect for later streams; a stream already held keeps its handler
    other = RecordingHandler()
    configure(other, group="cached")
    assert getStream("cached").handler is other
    assert first.handler is handler


def test_raising_handler_does_not_turn_success_into_failure_bug_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bug fix: a raising handler made @prof record a failure and raise into the caller."""
    handler = RaisingHandler()
    configure(handler)
    before = failure_counts().get("handler_error", 0)
    with caplog.at_level(logging.WARNING, logger="stepscope.metrics"):
        assert Service().bar() == 7  # no exception reaches the caller
        assert Service().bar() == 7
        put_metric("x", 1)
    # success + duration per call, then put_metric: every emit was attempted, none recorded
    # a failure, and the error was counted each time but logged once
    assert handler.calls == 5
    assert failure_counts()["handler_error"] - before == 5
    logged = [r for r in caplog.records if "handler error" in r.getMessage()]
    assert len(logged) <= 1


def test_raising_handler_in_strict_mode_raises() -> None:
    configure(RaisingHandler())
    set_strict(True)
    with pytest.raises(RuntimeError, match="backend is down"):
        put_metric("x", 1)


def test_failure_is_still_reported_when_the_function_raises_and_the_handler_raises() -> None:
    configure(RaisingHandler())
    with pytest.raises(RuntimeError, match="boom"):  # the function's own error, unchanged
        Service().throw()


def test_prof_duration_is_monotonic_integer_ms_bug_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug fix: durations came from time.time(); a wall-clock jump produced nonsense."""
    handler = RecordingHandler()
    configure(handler)
    real_time = time.time

    @prof
    def slow() -> None:
        # the wall clock jumps back an hour during the call; the duration must not notice
        monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
        deadline = clock.now_ns() + 20_000_000
        while clock.now_ns() < deadline:
            pass

    slow()
    value = handler.metric_data[f"{_get_metric_name(slow)}.duration.ms"].value
    assert isinstance(value, int)
    assert 20 <= value < 5000


def test_pipeline_handler_keeps_nanosecond_resolution() -> None:
    got: list[tuple[object, str, int]] = []

    class NsHandler(MetricHandler):
        def emit(self, metric_data: MetricData) -> None:
            pass

        def emit_elapsed(self, group_name: str | None, metric_name: str, elapsed_ns: int) -> None:
            got.append((group_name, metric_name, elapsed_ns))

    configure(NsHandler())

    @prof
    def quick() -> None:
        pass

    quick()
    assert len(got) == 1
    assert got[0][1] == f"{_get_metric_name(quick)}.duration.ms"
    assert isinstance(got[0][2], int) and 0 < got[0][2] < 1_000_000_000


def test_get_elapsed_time_ms_accepts_time_time_starts() -> None:
    start = time.time() - 1.5
    assert 1490 <= get_elapsed_time_ms(start) <= 1700


def test_deprecated_profile_and_publish_metric_warn_and_work() -> None:
    handler = RecordingHandler()
    configure(handler)
    with pytest.warns(FutureWarning, match="prof"):
        decorator = profile("legacy")

    @decorator
    def job() -> str:
        return "done"

    @decorator
    def broken() -> None:
        raise ValueError("bad")

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # calling the decorated function does not warn again
        assert job() == "done"
        with pytest.raises(ValueError):
            broken()
    assert handler.metric_data["job.success"].group_name == "legacy"
    assert handler.metric_data["broken.failure"].value == 1
    assert isinstance(handler.metric_data["job.duration.ms"].value, int)
    with pytest.warns(FutureWarning, match="put_metric"):
        publish_metric("legacy", "published", 4)
    assert handler.metric_data["published"].value == 4


def test_keyboard_interrupt_records_duration_but_no_outcome() -> None:
    handler = RecordingHandler()
    configure(handler)

    @prof
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    names = set(handler.metric_data)
    assert names == {f"{_get_metric_name(interrupted)}.duration.ms"}


def test_prof_and_put_metric_go_through_getstream_as_torchelastic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchelastic's own tests patch ``getStream`` instead of calling ``configure``."""
    handler = RecordingHandler()
    stream = MetricStream("torchelastic", handler)
    monkeypatch.setattr(api, "getStream", lambda group: stream)
    service = Service()
    service.bar()
    assert handler.metric_data["Service.bar.success"].value == 1
    assert "Service.bar.failure" not in handler.metric_data
    assert "Service.bar.duration.ms" in handler.metric_data
    with pytest.raises(RuntimeError):
        service.throw()
    assert handler.metric_data["Service.throw.failure"].value == 1
    assert "Service.throw.duration.ms" in handler.metric_data
    Child().base_func()
    assert handler.metric_data["Child.func.success"].value == 1
    api.put_metric("loss", 3, "anything")
    assert handler.metric_data["loss"].value == 3
    assert handler.metric_data["loss"].group_name == "torchelastic"  # the patched stream's


def test_configure_still_routes_groups_after_getstream_change() -> None:
    default, agent = RecordingHandler(), RecordingHandler()
    configure(default)
    configure(agent, group="agent")
    Service().bar2()
    api.put_metric("x", 1)
    assert "Service.bar2.success" in agent.metric_data
    assert "x" in default.metric_data and "x" not in agent.metric_data
