"""stepscope.events: event sequences, parent links, extractors, wrappers and trace spans."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope import events
from stepscope.clock import now_ns, to_unix_ns
from stepscope.config import config
from stepscope.distributed import rank_and_world_size
from stepscope.events import call as call_module
from stepscope.steps import set_step

_names = itertools.count()


class Capture(logging.Handler):
    """Keeps every record handed to it."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events among the records, oldest first."""
        return [r.msg for r in self.records if isinstance(r.msg, events.Event)]


def captured_logger(level: int = logging.INFO) -> tuple[logging.Logger, Capture]:
    """A fresh, non-propagating logger at ``level`` with a :class:`Capture` handler."""
    logger = logging.getLogger(f"test.stepscope.events.{next(_names)}")
    logger.propagate = False
    logger.setLevel(level)
    handler = Capture()
    logger.addHandler(handler)
    return logger, handler


def nothing() -> None:
    """A function to wrap."""


@pytest.fixture(autouse=True)
def _no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(call_module, "_ranks", call_module._RankCache())


def phases(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["phase"]) for e in evs]


# -- event sequences -------------------------------------------------------------------------


def test_success_start_then_end_with_every_field() -> None:
    logger, cap = captured_logger()

    @events.logged("load", logger=logger, shard=3)
    def load(x: int) -> int:
        return x * 2

    before = now_ns()
    assert load(21) == 42
    after = now_ns()
    start, end = cap.events
    assert phases([start, end]) == [("load", "start"), ("load", "end")]
    for ev in (start, end):
        assert before <= ev["mono_ns"] <= after
        assert ev["ts_ns"] == to_unix_ns(ev["mono_ns"])
        assert ev["level"] == "INFO"
        assert ev["pid"] == os.getpid()
        assert ev["thread"] == threading.get_native_id()
        assert ev["thread_name"] == threading.current_thread().name
        assert ev["logger"] == logger.name
        assert ev["span_id"] == start["span_id"]
        assert ev["parent_span_id"] is None
        assert (ev["step"], ev["rank"], ev["world_size"]) == (None, None, None)
        assert ev["attrs"] == {"shard": 3}
        assert ev["attrs_dropped"] == 0
    assert end["seq"] == start["seq"] + 1
    assert end["duration_ns"] == end["mono_ns"] - start["mono_ns"] > 0
    assert end["status"] == "ok"
    assert "status" not in start and "error" not in end
    rec = cap.records[0]
    assert rec.levelno == logging.INFO
    assert (rec.funcName, rec.lineno) == ("load", inspect.unwrap(load).__code__.co_firstlineno)
    assert rec.getMessage().startswith("load start shard=3")


def test_default_name_is_module_and_qualname() -> None:
    logger, cap = captured_logger()

    @events.logged(logger=logger)
    def helper() -> None:
        pass

    helper()
    assert (
        cap.events[0]["event"]
        == f"{__name__}.test_default_name_is_module_and_qualname.<locals>.helper"
    )


def test_exception_without_log_exceptions_still_closes_the_span_at_the_call_level() -> None:
    # the seed logs nothing when log_exceptions is False, leaving a start without an end
    logger, cap = captured_logger()
    boom = ValueError("disk full")

    @events.logged("save", logger=logger)
    def save() -> None:
        raise boom

    with pytest.raises(ValueError) as info:
        save()
    assert info.value is boom
    start, exc = cap.events
    assert phases([start, exc]) == [("save", "start"), ("save", "exception")]
    assert exc["level"] == "INFO" and cap.records[1].levelno == logging.INFO
    assert exc["status"] == "error"
    assert exc["error"] == {"type": "ValueError", "message": "disk full"}
    assert exc["duration_ns"] == exc["mono_ns"] - start["mono_ns"]
    assert exc["span_id"] == start["span_id"]


def test_log_exceptions_logs_at_error_even_when_the_level_is_disabled() -> None:
    logger, cap = captured_logger(logging.ERROR)

    class StorageError(OSError):
        pass

    @events.logged("save", logger=logger, log_exceptions=True, fields={"id": "checkpoint_id"})
    def save(checkpoint_id: str) -> None:
        raise StorageError("x" * 5000)

    with pytest.raises(StorageError):
        save("ckpt-7")
    (exc,) = cap.events
    assert exc["phase"] == "exception" and exc["level"] == "ERROR"
    assert cap.records[0].levelno == logging.ERROR
    assert exc["duration_ns"] is None  # nobody wanted the start, so it was not timed
    assert exc["attrs"] == {"id": "ckpt-7"}
    assert exc["error"]["type"].endswith("StorageError") and "." in exc["error"]["type"]
    message = exc["error"]["message"]
    assert message.startswith("x" * 100) and message.endswith("…[+3976 chars]")


def test_log_exceptions_with_the_level_enabled_gives_start_and_error() -> None:
    logger, cap = captured_logger(logging.DEBUG)

    @events.logged("save", logger=logger, log_exceptions=True, level=logging.DEBUG)
    def save() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        save()
    start, exc = cap.events
    assert (start["level"], exc["level"]) == ("DEBUG", "ERROR")
    assert exc["error"] == {"type": "KeyError", "message": "'k'"}
    assert exc["duration_ns"] >= 0


def test_nothing_at_all_when_the_logger_is_disabled_and_no_window_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger, cap = captured_logger(logging.WARNING)
    extracted: list[Any] = []
    lookups = []
    real = rank_and_world_size

    def counting_lookup() -> tuple[int | None, int | None]:
        lookups.append(1)
        return real()

    monkeypatch.setattr(call_module, "rank_and_world_size", counting_lookup)

    def extract(a: Any) -> int:
        extracted.append(a)
        return 1

    @events.logged("quiet", logger=logger, fields={"n": extract})
    def quiet(x: int) -> int:
        return x + 1

    first = events.logged("probe", level="ERROR", logger=logger)(nothing)
    first()
    assert [quiet(i) for i in range(100)] == list(range(1, 101))
    first()
    assert extracted == [] and len(lookups) == 1
    a, b = cap.events[1], cap.events[2]
    assert (a["phase"], b["phase"]) == ("end", "start")
    assert b["seq"] == a["seq"] + 1  # the disabled calls took no sequence numbers
    assert int(b["span_id"], 16) == int(a["span_id"], 16) + 1  # ... and no span ids


def test_level_changes_take_effect_at_once() -> None:
    logger, cap = captured_logger(logging.WARNING)

    @events.logged("x", logger=logger)
    def x() -> None:
        pass

    x()
    logger.setLevel(logging.INFO)
    x()
    logger.setLevel(logging.WARNING)
    x()
    logger.setLevel(logging.INFO)
    logging.disable(logging.INFO)
    try:
        x()
    finally:
        logging.disable(logging.NOTSET)
    logger.disabled = True
    try:
        x()
    finally:
        logger.disabled = False
    x()
    assert len(cap.events) == 4  # the second call and the last call


def test_seq_and_span_ids_are_unique_across_threads() -> None:
    logger, cap = captured_logger()

    @events.logged("work", logger=logger)
    def work() -> None:
        pass

    threads = [threading.Thread(target=lambda: [work() for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [e["seq"] for e in cap.events]
    assert len(seqs) == len(set(seqs)) == 1600
    assert max(seqs) - min(seqs) == 1599  # no gaps
    assert len({e["span_id"] for e in cap.events}) == 800


def test_step_and_rank_when_known(monkeypatch: pytest.MonkeyPatch) -> None:
    logger, cap = captured_logger()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")

    @events.logged("s", logger=logger)
    def s() -> None:
        pass

    set_step(12)
    try:
        s()
    finally:
        set_step(None)
    assert {(e["step"], e["rank"], e["world_size"]) for e in cap.events} == {(12, 3, 8)}


def test_event_str_is_a_one_line_summary() -> None:
    logger, cap = captured_logger()
    with pytest.raises(RuntimeError), events.logged("job", logger=logger, user="ann"):
        raise RuntimeError("bad\nthing")
    text = str(cap.events[-1])
    assert text.startswith("job exception error in ") and "RuntimeError: bad" in text
    assert "user='ann'" in text


# -- kinds of callables ----------------------------------------------------------------------


def test_methods_classmethods_and_staticmethods(tmp_path: Path) -> None:
    logger, cap = captured_logger()

    class Store:
        def __init__(self, root: Path) -> None:
            self.root = root

        @events.logged(logger=logger, fields={"root": lambda a: a["self"].root})
        def put(self, key: str, *, value: int = 0) -> str:
            return f"{key}={value}"

        @events.logged(logger=logger, fields={"k": "key"})
        @classmethod
        def make(cls, key: str) -> str:
            return cls.__name__ + key

        @events.logged(logger=logger, fields={"k": "key"})
        @staticmethod
        def check(key: str) -> bool:
            return bool(key)

    store = Store(tmp_path)
    assert store.put("a", value=2) == "a=2"
    assert Store.make("x") == "Storex"
    assert store.check("y") is True
    ends = [e for e in cap.events if e["phase"] == "end"]
    assert [e["event"].rsplit(".", 1)[-1] for e in ends] == ["put", "make", "check"]
    assert [e["attrs"] for e in ends] == [{"root": str(tmp_path)}, {"k": "x"}, {"k": "y"}]


def test_generator_ends_when_exhausted_and_links_only_its_own_body() -> None:
    logger, cap = captured_logger()
    inner = events.logged("inner", logger=logger)(nothing)

    @events.logged("produce", logger=logger)
    def produce(n: int) -> Generator[int, str | None, None]:
        for i in range(n):
            inner()
            got = yield i
            assert got in (None, "hello")
        return None

    gen = produce(2)
    assert cap.events == []  # nothing happens before the first next()
    assert next(gen) == 0
    inner()  # runs in the consumer: not a child of the generator
    assert gen.send("hello") == 1
    with pytest.raises(StopIteration):
        next(gen)
    names = phases(cap.events)
    assert names == [
        ("produce", "start"),
        ("inner", "start"),
        ("inner", "end"),
        ("inner", "start"),
        ("inner", "end"),
        ("inner", "start"),
        ("inner", "end"),
        ("produce", "end"),
    ]
    span = cap.events[0]["span_id"]
    parents = [e["parent_span_id"] for e in cap.events if e["event"] == "inner"]
    assert parents == [span, span, None, None, span, span]
    assert cap.events[-1]["status"] == "ok"


def test_generator_closed_early_and_generator_raising() -> None:
    logger, cap = captured_logger()
    cleaned = []

    @events.logged("stream", logger=logger)
    def stream() -> Generator[int, None, None]:
        try:
            yield 1
            yield 2
        finally:
            cleaned.append(True)

    gen = stream()
    next(gen)
    gen.close()
    assert cleaned == [True]
    assert cap.events[-1]["phase"] == "end" and cap.events[-1]["status"] == "closed"

    @events.logged("broken", logger=logger)
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        list(broken())
    assert cap.events[-1]["phase"] == "exception"
    assert cap.events[-1]["error"] == {"type": "OSError", "message": "gone"}

    @events.logged("echo", logger=logger)
    def echo() -> Generator[str, None, None]:
        try:
            yield "ready"
        except ValueError as exc:
            yield f"caught {exc}"

    gen2 = echo()
    next(gen2)
    assert gen2.throw(ValueError("v")) == "caught v"


def test_generator_return_value_passes_through() -> None:
    logger, _ = captured_logger()

    @events.logged("g", logger=logger)
    def g() -> Generator[int, None, int]:
        yield 1
        return 99

    def outer() -> Iterator[int]:
        result = yield from g()
        yield result

    assert list(outer()) == [1, 99]


def test_async_function_and_task_parent_links() -> None:
    logger, cap = captured_logger()

    @events.logged("child", logger=logger)
    async def child(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @events.logged("parent", logger=logger)
    async def parent() -> list[int]:
        return list(await asyncio.gather(child(1), child(2), asyncio.create_task(child(3))))

    async def main() -> list[int]:
        results = await parent()
        await child(4)  # after the parent ended: no parent
        return results

    assert asyncio.run(main()) == [1, 2, 3]
    parent_span = next(e["span_id"] for e in cap.events if e["event"] == "parent")
    children = [e for e in cap.events if e["event"] == "child"]
    assert [e["parent_span_id"] for e in children[:-2]] == [parent_span] * 6
    assert [e["parent_span_id"] for e in children[-2:]] == [None, None]


def test_concurrent_tasks_do_not_cross_link() -> None:
    logger, cap = captured_logger()

    @events.logged("leaf", logger=logger)
    async def leaf() -> None:
        await asyncio.sleep(0)

    @events.logged("root", logger=logger, fields={"n": "n"})
    async def root(n: int) -> None:
        for _ in range(3):
            await leaf()
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(root(1), root(2))

    asyncio.run(main())
    roots = {e["span_id"]: e["attrs"]["n"] for e in cap.events if e["event"] == "root"}
    assert len(roots) == 2
    leaves = [e for e in cap.events if e["event"] == "leaf" and e["phase"] == "end"]
    assert len(leaves) == 6
    counts = {n: 0 for n in roots.values()}
    for e in leaves:
        counts[roots[e["parent_span_id"]]] += 1
    assert counts == {1: 3, 2: 3}


def test_async_exception_and_async_generator() -> None:
    logger, cap = captured_logger()

    @events.logged("fails", logger=logger, log_exceptions=True)
    async def fails() -> None:
        await asyncio.sleep(0)
        raise TimeoutError("late")

    @events.logged("ticks", logger=logger)
    async def ticks(n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    async def main() -> list[int]:
        with pytest.raises(TimeoutError):
            await fails()
        return [i async for i in ticks(3)]

    assert asyncio.run(main()) == [0, 1, 2]
    assert phases(cap.events) == [
        ("fails", "start"),
        ("fails", "exception"),
        ("ticks", "start"),
        ("ticks", "end"),
    ]
    assert cap.events[1]["level"] == "ERROR"
    assert inspect.iscoroutinefunction(fails) and inspect.isasyncgenfunction(ticks)


def test_threads_link_through_a_copied_context_only() -> None:
    logger, cap = captured_logger()
    child = events.logged("child", logger=logger)(lambda tag: tag)

    @events.logged("parent", logger=logger)
    def parent() -> None:
        plain = threading.Thread(target=child, args=("plain",))
        ctx = contextvars.copy_context()
        copied = threading.Thread(target=ctx.run, args=(child, "copied"))
        for t in (plain, copied):
            t.start()
            t.join()

        async def via_to_thread() -> None:
            await asyncio.to_thread(child, "to_thread")

        asyncio.run(via_to_thread())

    parent()
    span = cap.events[0]["span_id"]
    threads = [e for e in cap.events if e["event"] == "child" and e["phase"] == "start"]
    assert [e["parent_span_id"] for e in threads] == [None, span, span]
    assert len({e["thread"] for e in threads} | {cap.events[0]["thread"]}) == 4


# -- context manager ------------------------------------------------------------------------


def test_context_manager_events_and_runtime_attributes() -> None:
    logger, cap = captured_logger()
    with events.logged("evaluate", logger=logger, epoch=3) as call:
        assert events.current_span_id() == call.span_id
        assert call.set("accuracy", 0.91) is True
        assert events.set_attr("loss", float("nan")) is True
    assert events.current_span_id() is None
    start, end = cap.events
    assert start["attrs"] == {"epoch": 3}
    assert end["attrs"] == {"epoch": 3, "accuracy": 0.91, "loss": "NaN"}


def test_context_manager_exception_and_reuse_across_threads_and_nesting() -> None:
    logger, cap = captured_logger()
    shared = events.logged("shared", logger=logger, log_exceptions=True)
    with pytest.raises(ZeroDivisionError), shared:
        _ = 1 / 0
    assert cap.events[-1]["level"] == "ERROR"
    assert cap.events[-1]["error"]["type"] == "ZeroDivisionError"
    cap.records.clear()
    with shared as outer, shared as inner:
        pass
    assert inner.span_id != outer.span_id
    evs = cap.events
    assert [e["span_id"] for e in evs] == [
        outer.span_id,
        inner.span_id,
        inner.span_id,
        outer.span_id,
    ]
    assert evs[1]["parent_span_id"] == outer.span_id
    cap.records.clear()
    barrier = threading.Barrier(4)

    def use() -> None:
        with shared:
            barrier.wait()

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_thread: dict[int, list[str]] = {}
    for e in cap.events:
        per_thread.setdefault(e["thread"], []).append(e["span_id"])
    assert len(per_thread) == 4
    assert all(len(ids) == 2 and ids[0] == ids[1] for ids in per_thread.values())


def test_context_manager_disabled_yields_a_no_op_handle_and_async_with() -> None:
    logger, cap = captured_logger(logging.WARNING)
    with events.logged("off", logger=logger) as call:
        assert call.span_id is None and call.set("a", 1) is False
        assert events.set_attr("a", 1) is False
    assert cap.events == []
    logger.setLevel(logging.INFO)

    async def main() -> None:
        async with events.logged("on", logger=logger) as c:
            c.set("k", "v")

    asyncio.run(main())
    assert phases(cap.events) == [("on", "start"), ("on", "end")]
    assert cap.events[1]["attrs"] == {"k": "v"}


def test_decorated_function_sets_attributes_for_its_end_event() -> None:
    logger, cap = captured_logger()

    @events.logged("write", logger=logger)
    def write(data: bytes) -> None:
        events.set_attr("bytes", len(data))

    write(b"abcd")
    assert "bytes" not in cap.events[0]["attrs"]
    assert cap.events[1]["attrs"] == {"bytes": 4}


# -- wrappers keep the function's behaviour -----------------------------------------------------


def test_generated_wrapper_keeps_signature_defaults_and_errors() -> None:
    logger, cap = captured_logger(logging.WARNING)
    sentinel: list[int] = []

    def f(
        a: int, b: int = 2, /, c: list[int] = sentinel, *rest: int, d: int, e: int = 5, **kw: Any
    ) -> Any:
        return (a, b, c, rest, d, e, kw)

    g = events.logged("f", logger=logger)(f)
    assert inspect.signature(g) == inspect.signature(f)
    assert inspect.unwrap(g) is f and g.__name__ == "f" and g.__doc__ == f.__doc__
    for level in (logging.WARNING, logging.INFO):
        logger.setLevel(level)
        assert g(1, d=4) == f(1, d=4)
        assert g(1, d=4)[2] is sentinel
        assert g(1, 3, [7], 8, 9, d=4, e=6, z=0) == f(1, 3, [7], 8, 9, d=4, e=6, z=0)
        bad_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((), {"d": 1}),
            ((1,), {}),
            ((1, 2, 3), {"c": 1, "d": 1}),
        ]
        for bad_args, bad_kwargs in bad_calls:
            with pytest.raises(TypeError) as ours:
                g(*bad_args, **bad_kwargs)
            with pytest.raises(TypeError) as theirs:
                f(*bad_args, **bad_kwargs)
            assert str(ours.value).split("() ")[-1] == str(theirs.value).split("() ")[-1]
    assert len(cap.events) == 6  # three good calls at INFO; bad calls fail before the body


def test_callables_without_a_plain_signature_use_the_generic_wrapper() -> None:
    logger, cap = captured_logger()
    sized = events.logged("len", logger=logger, fields={"n": lambda a: len(a.get("args", ()))})(len)
    assert sized([1, 2, 3]) == 3

    def _ss_reserved(_ss_x: int) -> int:
        return _ss_x

    assert events.logged("r", logger=logger)(_ss_reserved)(_ss_x=5) == 5
    part = events.logged("p", logger=logger)(functools.partial(pow, 2))
    assert part(10) == 1024
    assert [e["event"] for e in cap.events] == ["len", "len", "r", "r", "p", "p"]
    with pytest.raises(TypeError, match="decorates functions"):
        events.logged()(int)
    with pytest.raises(TypeError, match="decorates functions"):
        events.logged()(42)  # type: ignore[type-var]


def module_level(x: int) -> int:
    """A function pickled by reference."""
    return x


module_level = events.logged("module_level")(module_level)


def test_decorated_module_functions_pickle_by_reference() -> None:
    assert pickle.loads(pickle.dumps(module_level)) is module_level


def test_argument_validation() -> None:
    with pytest.raises(TypeError, match="event name"):
        events.logged(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log_exceptions"):
        events.logged(log_exceptions="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown logging level"):
        events.logged(level="LOUD")
    with pytest.raises(TypeError, match="logging level"):
        events.logged(level=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logger"):
        events.logged(logger=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fields must be"):
        events.logged(fields=3)
    with pytest.raises(TypeError, match="fields\\['x'\\]"):
        events.logged(fields={"x": 3})
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        events.logged(fields={"x": "nope"})(lambda a: a)
    with pytest.raises(TypeError, match="needs a name"), events.logged():
        pass
    with pytest.raises(RuntimeError, match="without a matching"):
        events.logged("x").__exit__(None, None, None)


# -- extractors ---------------------------------------------------------------------------------


class FileSystemWriter:
    """Shaped like torch.distributed.checkpoint's writer."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    @property
    def checkpoint_id(self) -> str | os.PathLike[str]:
        return self.path


class FileSystemReader(FileSystemWriter):
    """Shaped like torch.distributed.checkpoint's reader."""


class DefaultSavePlanner:
    """Shaped like torch.distributed.checkpoint's planner."""


class EmptyWriter:
    """A writer that is falsy (the seed's ``if storage_writer:`` skips it)."""

    checkpoint_id = "never-read"

    def __len__(self) -> int:
        return 0


CHECKPOINT_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"checkpoint_id": None}),
    ({"checkpoint_id": "ckpt/1"}, {"checkpoint_id": "ckpt/1"}),
    ({"checkpoint_id": Path("/ckpt/2")}, {"checkpoint_id": "/ckpt/2"}),
    (
        {"storage_writer": FileSystemWriter("/w"), "planner": DefaultSavePlanner()},
        {
            "checkpoint_id": "/w",
            "storage_writer": "FileSystemWriter",
            "planner": "DefaultSavePlanner",
        },
    ),
    (
        {"storage_reader": FileSystemReader(Path("/r"))},
        {"checkpoint_id": "/r", "storage_reader": "FileSystemReader"},
    ),
    (
        {"checkpoint_id": "", "storage_writer": FileSystemWriter("/w2")},
        {"checkpoint_id": "/w2", "storage_writer": "FileSystemWriter"},
    ),
    (
        {"checkpoint_id": "explicit", "storage_reader": FileSystemReader("/r")},
        {"checkpoint_id": "explicit", "storage_reader": "FileSystemReader"},
    ),
    ({"storage_writer": EmptyWriter()}, {"checkpoint_id": None}),
    (
        {"planner": DefaultSavePlanner(), "other": 1},
        {"checkpoint_id": None, "planner": "DefaultSavePlanner"},
    ),
]


@pytest.mark.parametrize(("kwargs", "expected"), CHECKPOINT_CASES)
def test_checkpoint_fields_reproduce_the_seed(
    kwargs: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert events.checkpoint_fields(kwargs) == expected


@pytest.mark.parametrize(("kwargs", "expected"), CHECKPOINT_CASES)
def test_checkpoint_fields_match_torch_dcp_logger(
    kwargs: dict[str, Any], expected: dict[str, Any]
) -> None:
    dcp_logger = pytest.importorskip("torch.distributed.checkpoint.logger")
    theirs = dcp_logger._msg_dict_from_dcp_method_args(**kwargs)
    theirs.pop("uuid", None)
    assert events.checkpoint_fields(kwargs) == theirs


def test_checkpoint_fields_with_torch_dcp_classes(tmp_path: Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    logger, cap = captured_logger()

    @events.logged(logger=logger, fields=events.checkpoint_fields)
    def save(
        state_dict: dict[str, Any],
        *,
        checkpoint_id: Any = None,
        storage_writer: Any = None,
        planner: Any = None,
    ) -> None:
        pass

    save({}, storage_writer=dcp.FileSystemWriter(tmp_path), planner=dcp.DefaultSavePlanner())

    @events.logged(logger=logger, fields=events.checkpoint_fields)
    def load(
        state_dict: dict[str, Any],
        *,
        checkpoint_id: Any = None,
        storage_reader: Any = None,
        planner: Any = None,
    ) -> None:
        pass

    load({}, storage_reader=dcp.FileSystemReader(tmp_path), planner=dcp.DefaultLoadPlanner())
    assert cap.events[1]["attrs"] == {
        "checkpoint_id": str(tmp_path),
        "storage_writer": "FileSystemWriter",
        "planner": "DefaultSavePlanner",
    }
    assert cap.events[3]["attrs"] == {
        "checkpoint_id": str(tmp_path),
        "storage_reader": "FileSystemReader",
        "planner": "DefaultLoadPlanner",
    }


def test_checkpoint_fields_see_positional_arguments_and_static_values() -> None:
    # the seed only looks at keyword arguments: a positional storage_writer was missed
    logger, cap = captured_logger()

    @events.logged("save", logger=logger, fields=events.checkpoint_fields, checkpoint_id="static")
    def save(
        state_dict: dict[str, Any], storage_writer: Any = None, checkpoint_id: Any = None
    ) -> None:
        pass

    save({}, FileSystemWriter("/positional"))
    save({}, FileSystemWriter("/w"), checkpoint_id="passed")
    attrs = [e["attrs"] for e in cap.events if e["phase"] == "end"]
    assert attrs == [
        {"checkpoint_id": "static", "storage_writer": "FileSystemWriter"},
        {"checkpoint_id": "passed", "storage_writer": "FileSystemWriter"},
    ]


def test_fields_forms_and_failing_extractors() -> None:
    logger, cap = captured_logger()

    def several(args: Any) -> dict[str, Any]:
        return {"sum": args["a"] + args["b"], 7: "int key"}  # type: ignore[dict-item]  # the test

    def broken(args: Any) -> Any:
        raise LookupError("no such thing")

    @events.logged(
        "f",
        logger=logger,
        fields=[
            {"first": "a", "rest": "more", "double": lambda a: a["a"] * 2},
            several,
            {"bad": broken},
        ],
    )
    def f(a: int, b: int = 10, *more: int, **options: Any) -> int:
        return a

    before = events.failure_counts().get("extractor_error", 0)
    assert f(1, 2, 3, 4, flag=True) == 1
    assert cap.events[0]["attrs"] == {
        "first": 1,
        "rest": [3, 4],
        "double": 2,
        "sum": 3,
        "7": "int key",
    }
    assert cap.events[0]["attrs_dropped"] == 1
    assert events.failure_counts()["extractor_error"] == before + 1
    config.strict = True
    try:
        with pytest.raises(LookupError):
            f(1)
    finally:
        config.strict = False


# -- the trace ----------------------------------------------------------------------------------


def test_calls_are_spans_in_a_recorded_trace_even_with_the_logger_off() -> None:
    logger, cap = captured_logger(logging.WARNING)

    @events.logged("ckpt.save", logger=logger, fields=events.checkpoint_fields)
    def save(*, checkpoint_id: str) -> None:
        inner()

    @events.logged("ckpt.inner", logger=logger)
    def inner() -> None:
        pass

    @events.logged("ckpt.fail", logger=logger)
    def fail() -> None:
        raise ValueError("nope")

    with stepscope.profile(torch_ops=False) as prof:
        save(checkpoint_id="c9")
        with pytest.raises(ValueError):
            fail()
    assert cap.events == []
    spans = {s.name: s for s in prof.events() if s.name.startswith("ckpt.")}
    outer, inner_span, failed = spans["ckpt.save"], spans["ckpt.inner"], spans["ckpt.fail"]
    assert outer.cat == "user_annotation"
    assert outer.tid == threading.get_native_id()
    assert outer.args is not None and inner_span.args is not None and failed.args is not None
    assert outer.args["checkpoint_id"] == "c9" and outer.args["stepscope.status"] == "ok"
    assert outer.start_ns <= inner_span.start_ns and inner_span.end_ns <= outer.end_ns
    assert failed.args["stepscope.status"] == "error"
    assert failed.args["stepscope.error"] == "ValueError: nope"


def test_span_ids_in_the_trace_match_the_logged_events() -> None:
    logger, cap = captured_logger()
    with stepscope.profile(torch_ops=False) as prof, events.logged("both", logger=logger, k=1):
        pass
    (span,) = [s for s in prof.events() if s.name == "both"]
    assert span.args is not None
    assert span.args["stepscope.span_id"] == cap.events[0]["span_id"]
    assert span.args["k"] == 1
    end = cap.events[1]
    assert span.dur_ns == end["duration_ns"]


@pytest.mark.implementation_independent
def test_events_land_in_the_trace_with_the_pure_python_twin(tmp_path: Path) -> None:
    script = tmp_path / "twin.py"
    script.write_text(
        "import stepscope\n"
        "from stepscope import events\n"
        "from stepscope.collectors import annotations\n"
        "assert annotations.default_backend is annotations.python_backend\n"
        "@events.logged('twin.call', answer=42)\n"
        "def f():\n"
        "    return 1\n"
        "f()\n"
        "with stepscope.profile(torch_ops=False) as prof:\n"
        "    f()\n"
        "(s,) = [s for s in prof.events() if s.name == 'twin.call']\n"
        "print(s.args['answer'], s.args['stepscope.status'])\n"
    )
    env = {**os.environ, "STEPSCOPE_IMPLEMENTATION": "python"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", "ok"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_restarts_seq_with_new_span_ids(tmp_path: Path) -> None:
    script = tmp_path / "fork.py"
    script.write_text(
        "import json, logging, os, sys\n"
        "from stepscope import events\n"
        "logger = logging.getLogger('fork'); logger.setLevel(logging.INFO)\n"
        "h = logging.StreamHandler(sys.stdout); h.setFormatter(events.JsonFormatter())\n"
        "logger.addHandler(h)\n"
        "step = events.logged('step', logger=logger)(lambda: None)\n"
        "step()\n"
        "sys.stdout.flush()\n"
        "pid = os.fork()\n"
        "step()\n"
        "sys.stdout.flush()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    parent_pid = rows[0]["pid"]
    parent = [(r["seq"], r["span_id"][:8]) for r in rows if r["pid"] == parent_pid]
    child = [(r["seq"], r["span_id"][:8]) for r in rows if r["pid"] != parent_pid]
    assert [s for s, _ in parent] == [0, 1, 2, 3]
    assert [s for s, _ in child] == [0, 1]
    assert len({p for _, p in parent}) == 1 and {p for _, p in child}.isdisjoint({parent[0][1]})
