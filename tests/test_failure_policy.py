"""One failure policy: every part counts its failures in ``failure_counts()``, logs them once on
``stepscope.failures.<area>`` and re-raises them under the one switch, ``config.strict``.

Each component fails for real: a collector that cannot claim the function tracer (another one
holds it), an exporter and an event sink whose files would have to live inside a regular file,
a metric table whose directory is a regular file, a trace handler whose directory was replaced
by a file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from stepscope import events, profile, record_function, trace_handler
from stepscope.collectors.base import WindowContext
from stepscope.collectors.python import PythonTracerCollector
from stepscope.config import config
from stepscope.failures import failure_counts, is_strict
from stepscope.metrics import JsonlExporter, Pipeline, RetryPolicy, set_strict
from stepscope.steps import set_step
from stepscope.tables import MetricTable

FAILING_TABLE = MetricTable.register_table("failure_policy_probe", ["step"])


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    """A regular file: nothing can be created below it."""
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


def count(area: str, kind: str) -> int:
    return failure_counts().get(area, {}).get(kind, 0)


def fast_pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(
        interval_s=60,
        handle_sigterm=False,
        spill_dir=tmp_path / "spill",
        retry=RetryPolicy(attempts=1, initial_backoff_s=0, max_backoff_s=0.01),
    )


def failing_collector_run() -> None:
    holder = PythonTracerCollector()  # holds the function tracer: the profile's cannot claim it
    holder.prepare(WindowContext(window=0))
    prof = profile(with_stack=True, torch_ops=False)
    try:
        prof.start()  # under config.strict this raises: stop() below still ends the profile
        with record_function("work"):
            pass
        prof.step()
    finally:
        prof.stop()
        holder.close()


def failing_exporter_run(tmp_path: Path, blocker: Path) -> None:
    pipeline = fast_pipeline(tmp_path)
    try:
        pipeline.add_exporter(JsonlExporter(blocker / "metrics.jsonl"))
        set_step(1)
        pipeline.scalar("loss").record(1.0)
        pipeline.flush(10)
    finally:
        pipeline.shutdown(timeout_s=5)


def failing_event_sink_run(tmp_path: Path, blocker: Path) -> None:
    pipeline = fast_pipeline(tmp_path)
    logger = logging.getLogger("test.failure_policy.events")
    handler = events.log_to_jsonl(blocker / "events.jsonl", logger=logger, pipeline=pipeline)
    try:
        with events.logged("evaluate", logger=logger):
            pass
        pipeline.flush(10)
    finally:
        logger.removeHandler(handler)
        pipeline.shutdown(timeout_s=5)


def failing_table_run(tmp_path: Path, blocker: Path) -> None:
    with config.patch(metric_tables="failure_policy_probe", tables_dir=str(blocker / "tables")):
        FAILING_TABLE.add_row(lambda: {"step": 1})


def failing_trace_handler_run(tmp_path: Path, blocker: Path) -> None:
    out = tmp_path / "traces"
    handler = trace_handler(out)
    out.rmdir()
    out.write_text("now a file, not a directory")
    try:
        with profile(on_trace_ready=handler, torch_ops=False) as prof:
            prof.step()
    finally:
        out.unlink()


CASES: dict[str, tuple[str, str, type[BaseException], Callable[[Path, Path], None]]] = {
    "collector": (
        "collectors",
        "collector_error",
        RuntimeError,
        lambda tmp, blocker: failing_collector_run(),
    ),
    "exporter": ("metrics", "export_error", OSError, failing_exporter_run),
    "event sink": ("metrics", "sink_error", OSError, failing_event_sink_run),
    "metric table": ("tables", "write_error", OSError, failing_table_run),
    "trace handler": ("handlers", "trace_write_error", OSError, failing_trace_handler_run),
}


@pytest.mark.parametrize("part", list(CASES))
def test_a_failing_part_is_counted_and_reraised_only_under_config_strict(
    part: str, tmp_path: Path, blocker: Path, caplog: pytest.LogCaptureFixture
) -> None:
    area, kind, error, run = CASES[part]
    before = count(area, kind)
    with caplog.at_level(logging.WARNING):
        run(tmp_path, blocker)  # the program goes on
    assert count(area, kind) > before
    logged = [r for r in caplog.records if r.name == f"stepscope.failures.{area}"]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]

    strict_dir = tmp_path / "strict"
    strict_dir.mkdir()
    config.strict = True
    before = count(area, kind)
    with pytest.raises(error):
        run(strict_dir, blocker)
    assert count(area, kind) > before


def test_every_strict_alias_sets_or_reads_config_strict() -> None:
    set_strict(True)
    assert config.strict and is_strict()
    set_strict(False)
    assert not config.strict and not is_strict()
    config.strict = True
    assert profile().strict is None  # a profile follows the switch unless told otherwise
    assert is_strict(profile().strict)
    assert not is_strict(profile(strict=False).strict)


def test_failures_never_reach_the_users_event_stream(tmp_path: Path) -> None:
    """Failure messages go to ``stepscope.failures.<area>``, never to ``stepscope.events``."""
    pipeline = fast_pipeline(tmp_path)
    path = tmp_path / "events.jsonl"
    handler = events.log_to_jsonl(path, pipeline=pipeline)  # on the stepscope.events logger

    def broken(args: object) -> dict[str, object]:
        raise LookupError("no such field")

    try:
        before = count("events", "extractor_error")
        with events.logged("save", fields=broken):
            pass
        pipeline.flush(10)
        assert count("events", "extractor_error") == before + 1
    finally:
        logging.getLogger("stepscope.events").removeHandler(handler)
        handler.close()
        pipeline.shutdown(timeout_s=5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["event"], line["phase"]) for line in lines] == [
        ("save", "start"),
        ("save", "end"),
    ]


@pytest.mark.torch
def test_the_programs_timeout_inside_an_optimizer_listener_reaches_the_program() -> None:
    """The program's SIGALRM handler raises while a stepscope optimizer-step listener runs (the
    step tables' and step triggers' hook): the program gets its exception from
    ``optimizer.step()``, as without stepscope, and no failure is counted."""
    import signal

    torch = pytest.importorskip("torch")
    from stepscope.collectors import optimizer_hook

    def listener(optimizer: object) -> None:
        signal.raise_signal(signal.SIGALRM)
        for _ in range(100):  # the handler runs at the interpreter's next check
            pass

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError("the program's own timeout")

    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    opt = torch.optim.SGD([param], lr=0.1)
    before = failure_counts().get("collectors", {}).get("optimizer_hook_error", 0)
    previous = signal.signal(signal.SIGALRM, timeout)
    optimizer_hook.add_listener(listener, strict=False)
    try:
        with pytest.raises(TimeoutError, match="the program's own timeout"):
            opt.step()
    finally:
        optimizer_hook.remove_listener(listener)
        signal.signal(signal.SIGALRM, previous)
    assert failure_counts().get("collectors", {}).get("optimizer_hook_error", 0) == before
