"""Fixtures shared by the test files.

- ``implementation``: each test that takes it runs once on the C extension (``native``, skipped
  with the reason when the extension is not in use) and once on the pure-Python twins
  (``python``); pass it on as ``implementation=`` or to ``stepscope._ext.resolve``.
- An autouse fixture puts back the process-wide state after every test: the step counter,
  ``stepscope.config`` (``strict`` included), the torchelastic-style metric handlers and a
  default metrics pipeline the test brought up; a profile the test left running is stopped and
  the test fails (one leak would otherwise fail every later test that starts a profile).
- ``pipeline``: a private metrics pipeline; ``udp``: a UDP socket that receives StatsD lines.
- A test marked ``implementation_independent`` (the twins stage skips it) fails at teardown if it
  reached a choice between the C extension and a twin (``tests/implementation_guard.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

import tests.implementation_guard as guard  # first: every stepscope module binds its wrappers
from stepscope import _ext
from stepscope.config import config
from stepscope.metrics import NullMetricHandler, Pipeline, api
from stepscope.metrics import default as default_pipeline
from stepscope.steps import set_step
from tests.metrics_fixtures import udp_receiver

# Test files that import an optional package at module level: where it is not installed they are
# left out of collection (and named in the header) instead of failing the whole run.
NEEDS_AT_IMPORT = {
    "test_metrics_failures.py": "prometheus_client",
    "test_metrics_servers.py": "prometheus_client",
    "test_reliability_prometheus.py": "prometheus_client",
    "test_reliability_property.py": "opentelemetry",
    "test_dataloader_workers.py": "torch",
    "test_dataloader_workers_real.py": "torch",
}
collect_ignore = [
    name for name, package in NEEDS_AT_IMPORT.items() if importlib.util.find_spec(package) is None
]


def pytest_report_header() -> list[str]:
    """Names the test files left out because an optional package is missing."""
    return [
        f"left out: {name} (needs {NEEDS_AT_IMPORT[name]}, not installed)"
        for name in collect_ignore
    ]


# Tests that measure the interpreter's own allocations or speed: coverage's tracer (which
# allocates and slows every line) changes what they measure, so `make test-coverage` leaves them
# out; they are marked `measures_interpreter` and `make test` runs them without it.
MEASURE_THE_INTERPRETER = {"test_memory.py", "test_memory_sampled.py", "test_overhead.py"}
UNDER_COVERAGE = os.environ.get("STEPSCOPE_UNDER_COVERAGE") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests of :data:`MEASURE_THE_INTERPRETER`; under coverage, skips them."""
    skip = pytest.mark.skip(reason="coverage's tracer changes what it measures (run without it)")
    for item in items:
        if item.path.name in MEASURE_THE_INTERPRETER:
            item.add_marker(pytest.mark.measures_interpreter)
            if UNDER_COVERAGE:
                item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Watch the record_function twin for the ``implementation_independent`` guard."""
    guard.watch_the_record_function_twin()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test starts with no choice of implementation reached (its fixtures count)."""
    guard.reached.clear()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A test marked ``implementation_independent`` reached no choice of implementation."""
    if guard.reached and item.get_closest_marker(guard.MARKER) is not None:
        found = ", ".join(sorted(guard.reached))
        pytest.fail(
            f"marked {guard.MARKER}, but it reached {found}: the twins stage would skip a test "
            "that exercises a twin (drop the marker)",
            pytrace=False,
        )


@pytest.fixture(params=["native", "python"])
def implementation(request: pytest.FixtureRequest) -> str:
    """``native`` (the C extension) or ``python`` (the twins): one run of the test each."""
    choice: str = request.param
    if choice == "native" and _ext.native() is None:
        pytest.skip(f"the C extension is not in use: {_ext.load_error}")
    return choice


@pytest.fixture(autouse=True)
def _reset_process_state() -> Iterator[None]:
    """Whatever a test sets process-wide is put back when it ends (pass or fail)."""
    settings = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
    pipeline_before = default_pipeline._default
    yield
    leaked = _stop_a_leaked_profile()
    if default_pipeline._default is not pipeline_before:
        made, default_pipeline._default = default_pipeline._default, pipeline_before
        if made is not None:
            made.shutdown(timeout_s=5)
    api._metrics_map.clear()
    api.configure(NullMetricHandler())
    for name, value in settings.items():
        if getattr(config, name) != value:
            setattr(config, name, value)
    set_step(None)
    if leaked:
        pytest.fail(f"the test left a profile running ({leaked}); it was stopped here")


def _stop_a_leaked_profile() -> str:
    """Stop a profile a test left registered, so that it fails alone instead of every later test
    that starts one; returns what was left ("" when nothing)."""
    module = sys.modules.get("stepscope.profiler.profile")
    if module is None:
        return ""
    left = [p for p in (module._active, module._paused_behind) if p is not None]
    for prof in left:
        with contextlib.suppress(BaseException):
            prof.stop()
    for name in ("_active", "_paused_behind"):
        setattr(module, name, None)
    return ", ".join(repr(p) for p in left)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    """A private metrics pipeline that exports only when flushed; shut down afterwards."""
    p = Pipeline(interval_s=60, handle_sigterm=False, spill_dir=tmp_path / "spill")
    yield p
    p.shutdown(timeout_s=5)


@pytest.fixture
def udp() -> Iterator[socket.socket]:
    """A bound UDP socket (see ``tests.metrics_fixtures.received``)."""
    sock = udp_receiver()
    yield sock
    sock.close()
