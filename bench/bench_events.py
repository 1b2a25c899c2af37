"""Structured events beside torch.distributed.checkpoint.logger, in one run.

Each case calls a checkpoint-shaped function (``save(state_dict, *, checkpoint_id=None,
storage_writer=None, planner=None)``) in a loop, bare and decorated, and reports ns per call:

- disabled: the logger is off for the level and no profiler window records.  stepscope's
  target (from the issue): at most 150 ns more than the bare call.  The checkpoint logger's
  decorator has no disabled path (it builds its dict, a uuid and times before asking the
  logger), so its logger set to WARNING is what "off" means for it.
- enabled, null handler: events built and handed to a ``logging.NullHandler`` (the checkpoint
  logger's default handler), both at the level they log at.
- enabled, to a file: stepscope through ``JsonlHandler`` (the export thread writes) vs the
  checkpoint logger through a ``logging.FileHandler``; the time is the caller's, the files are
  checked afterwards.
- trace only: the logger off, a profiler window recording: stepscope's span vs ``traced``.
"""

from __future__ import annotations

import gc
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stepscope
from harness import Report
from stepscope import events
from stepscope.metrics.pipeline import Pipeline

N_FAST = 200_000
N_SLOW = 20_000


class FileSystemWriter:
    """Shaped like DCP's writer: a ``checkpoint_id`` property."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def checkpoint_id(self) -> str:
        return self.path


class DefaultSavePlanner:
    """Shaped like DCP's planner (only its class name is logged)."""


def save(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | None = None,
    storage_writer: Any = None,
    planner: Any = None,
) -> int:
    """The function every case decorates."""
    return len(state_dict)


def checkpoint_logger() -> tuple[Any, logging.Logger] | None:
    """torch's ``_dcp_method_logger`` and its logger, or None without torch."""
    try:
        from torch.distributed.checkpoint import logger as dcp_logger
    except ImportError:
        return None
    return dcp_logger._dcp_method_logger, dcp_logger._dcp_logger


def loop(fn: Callable[..., Any], n: int) -> Callable[[], None]:
    """``n`` calls of ``fn`` shaped like a DCP save."""
    sd = {"w": 1}
    writer = FileSystemWriter("/ckpt/step_100")
    planner = DefaultSavePlanner()

    def run() -> None:
        for _ in range(n):
            fn(sd, storage_writer=writer, planner=planner)

    return run


def run(report: Report) -> None:
    """Measure every case for stepscope and, where torch is installed, for the checkpoint logger."""
    scale = 10 if report.quick else 1
    repeat = 3 if report.quick else 7
    n_fast, n_slow = N_FAST // scale, N_SLOW // scale
    ours_logger = logging.getLogger("bench.stepscope.events")
    ours_logger.propagate = False
    ours = events.logged(
        "save", fields=events.checkpoint_fields, log_exceptions=True, logger=ours_logger
    )(save)
    found = checkpoint_logger()

    # -- disabled --------------------------------------------------------------------------
    ours_logger.setLevel(logging.WARNING)
    bare = report.measure(
        "disabled", "bare call", loop(save, n_fast), repeat=repeat, per_call=n_fast
    )
    mine = report.measure(
        "disabled", "stepscope logged", loop(ours, n_fast), repeat=repeat, per_call=n_fast
    )
    report.target("disabled: ns added to the bare call", mine.median - bare.median, 150.0)
    if found is not None:
        decorator, ckpt_log = found
        theirs = decorator(log_exceptions=True)(save)
        ckpt_log.setLevel(logging.WARNING)
        peer = report.measure(
            "disabled", "torch _dcp_method_logger", loop(theirs, n_slow), repeat=repeat,
            per_call=n_slow,
        )  # fmt: skip
        report.ratio("disabled", mine, peer)
        report.note(
            f"disabled overhead over the bare call: stepscope {mine.median - bare.median:.0f} ns, "
            f"checkpoint logger {peer.median - bare.median:.0f} ns"
        )

    # -- enabled, null handler --------------------------------------------------------------
    null = logging.NullHandler()
    ours_logger.addHandler(null)
    ours_logger.setLevel(logging.INFO)
    mine = report.measure(
        "enabled, NullHandler", "stepscope logged", loop(ours, n_slow), repeat=repeat,
        per_call=n_slow,
    )  # fmt: skip
    if found is not None:
        ckpt_log.setLevel(logging.DEBUG)
        peer = report.measure(
            "enabled, NullHandler", "torch _dcp_method_logger", loop(theirs, n_slow),
            repeat=repeat, per_call=n_slow,
        )  # fmt: skip
        report.ratio("enabled, NullHandler", mine, peer)
    ours_logger.removeHandler(null)

    # -- enabled, to a file -----------------------------------------------------------------
    with tempfile.TemporaryDirectory() as tmp:
        # a long interval keeps the export thread asleep while the caller is timed; the export
        # work (JSON encoding + append) is then timed on its own by flushing
        pipeline = Pipeline(interval_s=3600.0, ring_capacity=1 << 21, handle_sigterm=False)
        try:
            handler = events.log_to_jsonl(
                Path(tmp) / "events.jsonl", logger=ours_logger, pipeline=pipeline, max_bytes=1 << 40
            )
            caller, export = [], []
            for _ in range(repeat):
                calls = loop(ours, n_slow)
                gc.collect()
                t0 = time.perf_counter_ns()
                calls()
                t1 = time.perf_counter_ns()
                handler.flush(timeout_s=600.0)
                t2 = time.perf_counter_ns()
                caller.append((t1 - t0) / n_slow)
                export.append((t2 - t1) / n_slow)
            mine = report.add(
                "enabled, to a file", "stepscope JsonlHandler (caller)", "ns/call", caller
            )
            spent = report.add("enabled, to a file", "stepscope export thread", "ns/call", export)
            lines = handler.path.read_text().splitlines()
            if len(lines) != 2 * n_slow * repeat or handler.dropped:
                raise RuntimeError(f"{len(lines)} lines written, {handler.dropped} dropped")
            if json.loads(lines[-1])["attrs"]["checkpoint_id"] != "/ckpt/step_100":
                raise RuntimeError(f"unexpected last line {lines[-1]}")
            ours_logger.removeHandler(handler)
            handler.close()
        finally:
            pipeline.shutdown()
        if found is not None:
            file_handler = logging.FileHandler(Path(tmp) / "checkpoint.log")
            ckpt_log.addHandler(file_handler)
            try:
                peer = report.measure(
                    "enabled, to a file", "torch _dcp_method_logger", loop(theirs, n_slow),
                    repeat=repeat, per_call=n_slow,
                )  # fmt: skip
            finally:
                ckpt_log.removeHandler(file_handler)
                file_handler.close()
            report.ratio("enabled, to a file: caller's time", mine, peer)
            total = mine.median + spent.median
            report.note(
                f"enabled, to a file: caller + export thread = {total:.0f} ns/call, "
                f"{total / peer.median:.3f} x the checkpoint logger's FileHandler"
            )

    # -- trace only -------------------------------------------------------------------------
    ours_logger.setLevel(logging.WARNING)
    traced = stepscope.traced(save)
    with stepscope.profile():
        mine = report.measure(
            "trace only", "stepscope logged", loop(ours, n_slow), repeat=repeat, per_call=n_slow
        )
        peer = report.measure(
            "trace only", "stepscope traced", loop(traced, n_slow), repeat=repeat, per_call=n_slow
        )
    report.ratio("trace only: logged / traced", mine, peer)
