"""stepscope.events as JSON: value coercion and limits, the JSON formatter, the JSON-lines sink."""

from __future__ import annotations

import io
import json
import logging
import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import events
from stepscope.events.coerce import AttrSet, Limits, coerce
from stepscope.jsonenc import json_bytes
from stepscope.metrics.pipeline import Pipeline
from tests.test_events import captured_logger


def strict_loads(raw: bytes | str) -> Any:
    """json.loads that refuses NaN/Infinity (not JSON)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-JSON constant {token}")

    return json.loads(raw, parse_constant=refuse)


@pytest.fixture
def limits() -> Iterator[None]:
    saved = events.get_limits()
    yield
    events.set_limits(**{f: getattr(saved, f) for f in saved.__dataclass_fields__})


class RaisingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class WrongRepr:
    def __repr__(self) -> Any:
        return 42


class HostileGetattr:
    """Every attribute lookup raises."""

    def __getattr__(self, name: str) -> Any:
        raise SystemError(name)


class LyingBool:
    def __bool__(self) -> bool:
        raise RuntimeError("truthiness refused")


def recursive_list() -> list[Any]:
    x: list[Any] = [1]
    x.append(x)
    return x


def recursive_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


HOSTILE: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "ninf": -math.inf,
    "huge_int": 10**400,
    "bytes": b"\x00\xff" * 3000,
    "surrogate": "ok \udc80 bad",
    "control": "line\nbreak\t\x00nul",
    "long": "y" * 100_000,
    "recursive_list": recursive_list(),
    "recursive_dict": recursive_dict(),
    "raising_repr": RaisingRepr(),
    "wrong_repr": WrongRepr(),
    "hostile_getattr": HostileGetattr(),
    "tuple_keys": {(1, 2): "a", None: "b", 3.5: "c"},
    "set": {3, 1, 2},
    "deep": [[[[[[["bottom"]]]]]]],
    "many": list(range(10_000)),
    "path": Path("/tmp/x"),
    "type": int,
    "exception": ValueError("v"),
    "bytearray": bytearray(b"ab"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_values_become_valid_bounded_json(name: str) -> None:
    value = coerce(HOSTILE[name])
    raw = json_bytes({"v": value})
    decoded = strict_loads(raw)["v"]
    assert len(raw) < 8 * Limits().max_chars * 2
    if isinstance(decoded, list):
        assert len(decoded) <= Limits().max_items + 1


def test_coercion_of_ordinary_values() -> None:
    assert coerce(float("nan")) == "NaN" and coerce(-math.inf) == "-Infinity"
    assert coerce(True) is True and coerce(None) is None and coerce(3) == 3 and coerce(2.5) == 2.5
    assert coerce(10**30) == str(10**30)
    assert coerce((1, "a")) == [1, "a"]
    assert coerce({3, 1, 2}) == [1, 2, 3]
    assert coerce({"k": {1: 2}}) == {"k": {"1": 2}}
    assert coerce(Path("/a/b")) == "/a/b"
    assert coerce(b"ab") == "b'ab'"
    assert coerce(RaisingRepr()) == "<unrepresentable RaisingRepr>"
    assert coerce(WrongRepr()) == "<unrepresentable WrongRepr>"
    assert coerce("z" * 2000) == "z" * 1024 + "…[+976 chars]"
    assert coerce(list(range(40))) == [*range(32), "…+8 more"]
    assert coerce({str(i): i for i in range(33)})["…"] == "+1 more"
    assert coerce([[[["deep"]]]]) == [[["['deep']"]]]  # max_depth levels, then the repr


def test_tensors_are_described_not_printed() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(2, 3, dtype=torch.float16)
    assert coerce(t) == "Tensor(shape=[2, 3], dtype=torch.float16, device=cpu)"
    assert coerce({"grad": torch.ones(4)}) == {
        "grad": "Tensor(shape=[4], dtype=torch.float32, device=cpu)"
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text() | st.integers(), inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_value_coerces_to_strict_json(value: Any) -> None:
    strict_loads(json_bytes({"attrs": {"v": coerce(value)}}))


def test_attribute_limits_count_what_is_dropped(limits: None) -> None:
    events.set_limits(max_attrs=3, max_chars_total=200, max_chars=50)
    attrs = AttrSet()
    assert attrs.add("a", 1) and attrs.add("b", "x" * 50) and attrs.add("c", 2)
    assert not attrs.add("d", 3)  # a fourth attribute
    assert attrs.add("a", 5)  # replacing one is fine
    assert attrs.values == {"a": 5, "b": "x" * 50, "c": 2} and attrs.dropped == 1
    small = AttrSet()
    assert small.add("big", "y" * 50) and small.add("big2", "y" * 50)
    assert not small.add("big3", ["y" * 50] * 3)  # over the total budget
    assert small.dropped == 1
    logger, cap = captured_logger()
    many: dict[str, Any] = {f"k{i}": i for i in range(5)}
    with events.logged("many", logger=logger, **many):
        pass
    assert cap.events[0]["attrs"] == {"k0": 0, "k1": 1, "k2": 2}
    assert cap.events[0]["attrs_dropped"] == 2


def test_set_limits_validation(limits: None) -> None:
    with pytest.raises(ValueError, match="unknown event limits"):
        events.set_limits(max_things=3)
    with pytest.raises(ValueError, match="positive int"):
        events.set_limits(max_attrs=0)
    assert events.set_limits(max_items=4).max_items == 4
    assert coerce(list(range(10))) == [0, 1, 2, 3, "…+6 more"]


def test_events_with_hostile_attributes_are_valid_json_lines() -> None:
    logger, cap = captured_logger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(events.JsonFormatter())
    logger.addHandler(handler)

    @events.logged("hostile", logger=logger, fields={"writer": lambda a: LyingBool()}, **HOSTILE)
    def hostile(arg: Any) -> None:
        raise ValueError(RaisingRepr())

    with pytest.raises(ValueError):
        hostile(HostileGetattr())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    start, exc = (strict_loads(line) for line in lines)
    assert start == json.loads(json_bytes(cap.events[0]))
    assert set(start["attrs"]) == set(HOSTILE) | {"writer"}
    assert start["attrs"]["nan"] == "NaN"
    surrogate = start["attrs"]["surrogate"]
    assert surrogate.startswith("ok \ufffd") and surrogate.endswith("\ufffd bad")
    assert exc["error"]["type"] == "ValueError"


# -- the formatter ------------------------------------------------------------------------------


def test_json_formatter_renders_plain_records_on_one_line() -> None:
    formatter = events.JsonFormatter()
    logger = logging.getLogger("test.events.plain")
    try:
        raise KeyError("k")
    except KeyError:
        record = logger.makeRecord(
            logger.name,
            logging.WARNING,
            "/src/app.py",
            7,
            "loaded %d rows\nfrom %s",
            (3, "db"),
            sys.exc_info(),
            extra={"table": "users", "size": float("inf")},
        )
    line = formatter.format(record)
    assert "\n" not in line
    obj = strict_loads(line)
    assert obj["message"] == "loaded 3 rows\nfrom db"
    assert (obj["level"], obj["logger"], obj["file"], obj["line"]) == (
        "WARNING",
        "test.events.plain",
        "/src/app.py",
        7,
    )
    assert obj["ts_ns"] == int(record.created * 1e9)
    assert obj["attrs"] == {"table": "users", "size": "Infinity"}
    assert obj["exc"].startswith("Traceback") and "KeyError: 'k'" in obj["exc"]


# -- the JSON-lines sink ------------------------------------------------------------------------


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    p = Pipeline(interval_s=3600.0, handle_sigterm=False)
    yield p
    p.shutdown()


def test_jsonl_sink_end_to_end(tmp_path: Path, pipeline: Pipeline) -> None:
    path = tmp_path / "events.jsonl"
    logger = logging.getLogger("test.events.jsonl.e2e")
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    handler = events.log_to_jsonl(path, logger=logger, pipeline=pipeline)
    assert logger.level == logging.INFO  # lowered so the events are enabled
    caller = threading.get_native_id()

    @events.logged("save", logger=logger, fields=events.checkpoint_fields, log_exceptions=True)
    def save(*, checkpoint_id: str) -> None:
        if checkpoint_id == "bad":
            raise OSError("quota")

    save(checkpoint_id="a")
    with pytest.raises(OSError):
        save(checkpoint_id="bad")
    logger.info("a plain record %s", "too")
    assert not path.exists() or path.read_text() == ""  # nothing written on the caller's thread
    handler.flush()
    rows = [strict_loads(line) for line in path.read_text().splitlines()]
    assert [(r.get("event"), r.get("phase")) for r in rows] == [
        ("save", "start"),
        ("save", "end"),
        ("save", "start"),
        ("save", "exception"),
        (None, None),
    ]
    assert rows[1]["attrs"] == {"checkpoint_id": "a"} and rows[1]["status"] == "ok"
    assert rows[3]["level"] == "ERROR" and rows[3]["error"]["message"] == "quota"
    assert rows[4]["message"] == "a plain record too"
    assert {r.get("thread") for r in rows[:4]} == {caller}
    assert [r["seq"] for r in rows[:4]] == list(range(rows[0]["seq"], rows[0]["seq"] + 4))
    telemetry = pipeline.telemetry()["channels"][handler.channel.name]
    assert telemetry["exported"] == 5 and telemetry["dropped"] == 0
    logger.removeHandler(handler)
    handler.close()
    assert handler.sink.closed


def test_jsonl_ring_full_drops_are_counted(tmp_path: Path) -> None:
    small = Pipeline(interval_s=3600.0, ring_capacity=4, handle_sigterm=False)
    try:
        logger = logging.getLogger("test.events.jsonl.full")
        logger.propagate = False
        handler = events.log_to_jsonl(tmp_path / "e.jsonl", logger=logger, pipeline=small)
        small.ring.set_waker(None)  # keep the export thread asleep while the ring fills
        for i in range(5):
            with events.logged("tick", logger=logger, i=i):
                pass
        assert handler.dropped == 6
        handler.flush()
        lines = (tmp_path / "e.jsonl").read_text().splitlines()
        assert [strict_loads(line)["attrs"]["i"] for line in lines] == [0, 0, 1, 1]
        assert small.telemetry()["channels"][handler.channel.name]["dropped"] == 6
        logger.removeHandler(handler)
        handler.close()
        logger.error("after close")  # the handler is gone: nothing more is written
        with events.logged("late", logger=logger):
            pass
        handler.sink.write_records([{"late": True}], 1.0)  # a batch arriving after close
        assert handler.dropped == 7
        assert len((tmp_path / "e.jsonl").read_text().splitlines()) == 4
    finally:
        small.shutdown()


def test_jsonl_handler_on_the_process_pipeline(tmp_path: Path) -> None:
    logger = logging.getLogger("test.events.jsonl.default")
    logger.propagate = False
    handler = events.JsonlHandler(tmp_path / "p.jsonl", level="INFO")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with events.logged("default_pipeline", logger=logger):
            pass
        handler.flush()
        rows = [strict_loads(line) for line in handler.path.read_text().splitlines()]
        assert [r["phase"] for r in rows] == ["start", "end"]
    finally:
        logger.removeHandler(handler)
        handler.close()
