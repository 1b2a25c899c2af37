"""The recording options: one type read the same from ``run``'s and ``attach``'s flags, from an
attach request (today's and the one sent before the type existed), checked in one line naming
the flag, and applied to a profile — built, or moved onto an on-demand session's live one."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stepscope._version import __version__
from stepscope.activity import ProfilerActivity
from stepscope.cli import build_parser, main
from stepscope.profiler.control_protocol import RecordMessage
from stepscope.profiler.options import RecordingOptions

FLAGS = [
    "-o", "traces", "--activities", "cpu,Sampling", "--sampling-rate", "250", "--with-stack",
    "--memory", "--gzip", "--max-calls", "1000", "--include", "json", "--include", "mypkg.*",
    "--exclude", "mypkg.slow", "--max-depth", "4", "--record-shapes", "--with-flops",
    "--with-modules",
]  # fmt: skip
EXPECTED = RecordingOptions(
    out="traces",
    activities=("CPU", "SAMPLING"),
    sampling_rate_hz=250.0,
    with_stack=True,
    profile_memory=True,
    gzip=True,
    max_calls=1000,
    include=("json", "mypkg.*"),
    exclude=("mypkg.slow",),
    max_depth=4,
    record_shapes=True,
    with_flops=True,
    with_modules=True,
)


def test_run_and_attach_read_the_same_flags_into_the_same_options() -> None:
    parser = build_parser()
    run = parser.parse_args(["run", *FLAGS, "prog.py"])
    attach = parser.parse_args(["attach", "123", *FLAGS])
    assert RecordingOptions.from_args(run) == RecordingOptions.from_args(attach) == EXPECTED
    defaults = RecordingOptions.from_args(parser.parse_args(["attach", "123"]))
    assert defaults == RecordingOptions.from_args(parser.parse_args(["run", "p.py"]))
    assert defaults == RecordingOptions()
    assert defaults.activities is None  # each surface's own default
    auto = parser.parse_args(["run", "--activities", "auto", "p.py"])
    assert RecordingOptions.from_args(auto).activities is None
    assert parser.parse_args(["attach", "1", "--profile-memory"]).profile_memory is True


def test_the_wire_form_round_trips_and_leaves_defaults_out(tmp_path: Path) -> None:
    out = str(tmp_path / "traces")
    options = replace(EXPECTED, out=out)
    wire = json.loads(json.dumps(options.to_wire()))  # what travels is plain JSON
    assert RecordingOptions.from_wire(wire) == options
    assert wire["memory"] is True and "profile_memory" not in wire  # the key attach always sent
    assert wire["include"] == ["json", "mypkg.*"]
    assert RecordingOptions(out=out).to_wire() == {"out": out}
    relative = RecordingOptions(out="rel/dir").to_wire()["out"]
    assert relative == str(Path.cwd() / "rel" / "dir")


def test_a_request_in_the_form_attach_sent_before_the_type_is_read_the_same(
    tmp_path: Path,
) -> None:
    out = str(tmp_path)
    before = {
        "op": "record",
        "steps": 3,
        "out": out,
        "activities": None,
        "with_stack": True,
        "memory": True,
        "sampling_rate_hz": 250.0,
        "gzip": True,
        "start_step": 40,
    }
    asked = RecordMessage.from_message(before)
    assert (asked.steps, asked.start_step) == (3, 40)
    assert asked.options == RecordingOptions(
        out=out, with_stack=True, profile_memory=True, sampling_rate_hz=250.0, gzip=True
    )
    again = RecordMessage.from_message({"op": "record", **asked.to_message()})
    assert again == asked


def test_an_option_this_process_does_not_know_is_refused_in_one_line(tmp_path: Path) -> None:
    message = {"steps": 2, "out": str(tmp_path), "flight_recorder": 5, "a_new_one": True}
    with pytest.raises(ValueError) as caught:
        RecordMessage.from_message(message)
    said = str(caught.value)
    assert "\n" not in said and f"stepscope {__version__}" in said
    assert "'a_new_one', 'flight_recorder'" in said


BAD = [
    ({"with_stack": "yes"}, "--with-stack must be true or false, got 'yes'"),
    ({"sampling_rate_hz": math.nan}, "--sampling-rate must be a number above 0 and at most"),
    ({"sampling_rate_hz": 1e9}, "--sampling-rate must be a number above 0 and at most 100000"),
    ({"sampling_rate_hz": "fast"}, "--sampling-rate must be a number, got 'fast'"),
    ({"max_calls": 0}, "--max-calls must be 1 or more, got 0"),
    ({"max_calls": True}, "--max-calls must be a whole number, got True"),
    ({"max_depth": -1}, "--max-depth must be 0 or more, got -1"),
    ({"include": "mypkg"}, "--include must be a list of names, got 'mypkg'"),
    ({"activities": ("CPU", "BOGUS")}, "unknown profiler activity 'BOGUS'"),
    ({"activities": "CPU"}, "--activities must be a list of names, got 'CPU'"),
    ({"out": ""}, "--out must name a directory"),
    ({"trace_format": "xml"}, "--trace-format: unknown trace format 'xml'; choose one of"),
    ({"gzip": True, "trace_format": "compact"}, "--gzip is for Chrome JSON traces"),
]


@pytest.mark.parametrize(("given", "says"), BAD)
def test_a_bad_value_is_one_line_naming_the_flag(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as caught:
        RecordingOptions(**given)
    assert says in str(caught.value), caught.value
    assert "\n" not in str(caught.value)


def test_the_trace_format_is_one_option_for_run_and_the_wire(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--trace-format compact``: ``run`` writes ``.sstrace`` windows and names them at its
    end; the option travels in an attach request like any other."""
    options = RecordingOptions(out=str(tmp_path), trace_format="compact")
    wire = options.to_wire()
    assert wire["trace_format"] == "compact"
    assert RecordingOptions.from_wire(wire) == options
    program = tmp_path / "loop.py"
    program.write_text(
        "def step():\n    return sum(range(20_000))\n\nfor _ in range(8):\n    step()\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["run", "-o", str(out), "--trace-format", "compact", "--step-on", "loop:step",
                 "--wait", "1", "--warmup", "1", "--active", "2", str(program)]) == 0  # fmt: skip
    (written,) = out.glob("*.pt.trace.sstrace")
    assert str(written) in capsys.readouterr().err
    assert not list(out.glob("*.json"))
    assert main(["report", str(written), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())


def test_a_request_is_checked_as_the_flags_are(tmp_path: Path) -> None:
    for bad, says in (
        ({"out": "relative"}, "must be an absolute path, got 'relative'"),
        ({"sampling_rate_hz": 0}, "--sampling-rate must be a number above 0"),
        ({"memory": 1}, "--memory must be true or false, got 1"),
        ({"max_calls": 0}, "--max-calls must be 1 or more"),
        ({"steps": 5000}, "over the limit of 1000"),
    ):
        with pytest.raises(ValueError, match=says):
            RecordMessage.from_message({"steps": 2, "out": str(tmp_path), **bad})


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-calls", "0"), ("--max-depth", "-1"), ("--sampling-rate", "inf")],
)
def test_attach_refuses_a_bad_recording_value_before_looking_for_the_process(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert main(["attach", "999999999", f"{flag}={value}"]) == 1  # no such process: never asked
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith(f"stepscope attach: error: {flag} must be "), err


def test_profile_kwargs_make_a_profile_that_records_those_options() -> None:
    import stepscope

    plain_python = replace(EXPECTED, record_shapes=False, with_flops=False, with_modules=False)
    prof = stepscope.profile(**plain_python.profile_kwargs(["CPU"]), torch_ops=False)
    assert prof.activities == {ProfilerActivity.CPU, ProfilerActivity.SAMPLING}
    assert (prof.sampling_rate_hz, prof.with_stack, prof.profile_memory) == (250.0, True, True)
    assert prof.tracer_options == {
        "event_budget": 1000,
        "include": ("json", "mypkg.*"),
        "exclude": ("mypkg.slow",),
        "max_depth": 4,
    }
    plain = stepscope.profile(**RecordingOptions().profile_kwargs(["SAMPLING", "CPU"]))
    assert plain.activities == {ProfilerActivity.CPU, ProfilerActivity.SAMPLING}


def _window(tmp_path: Path, options: RecordingOptions, work: Any) -> dict[str, Any]:
    """One on-demand window of 2 steps, in this process, with ``work()`` in each step; the file
    as JSON (read with the standard library, not stepscope's reader)."""
    from stepscope.profiler.on_demand import OnDemand, WindowRequest

    session = OnDemand(None).start()
    try:
        request = WindowRequest(2, options)
        assert session.submit(request) == ""
        for _ in range(5):
            work()
            session.step()
    finally:
        session.stop()
    assert request.state == "done", request.reason
    [path] = request.files
    document: dict[str, Any] = json.loads(Path(path).read_text())
    return document


def test_an_on_demand_window_records_the_function_tracer_options_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPSCOPE_LISTEN_DIR", str(tmp_path / "ctl"))

    def mine() -> int:
        return sum(range(10))

    def work() -> None:
        json.dumps({"a": [1, 2]})
        mine()

    options = RecordingOptions(
        out=str(tmp_path), activities=("CPU",), with_stack=True, include=("json",), max_calls=999
    )
    document = _window(tmp_path, options, work)
    calls = [e["name"] for e in document["traceEvents"] if e.get("cat") == "python_function"]
    assert any("dumps" in name for name in calls), calls
    assert all(name.startswith("json/") for name in calls), calls  # mine() is not in json
    assert document["stepscope_python_tracer"]["event_budget"] == 999
    assert document["with_stack"] == 1 and document["stepscope_activities"] == ["CPU"]


def test_an_on_demand_window_records_shapes_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("STEPSCOPE_LISTEN_DIR", str(tmp_path / "ctl"))
    x, w = torch.randn(64, 32), torch.randn(32, 16)

    def work() -> None:
        x @ w

    def mm_args(options: RecordingOptions) -> list[dict[str, Any]]:
        events = _window(tmp_path, options, work)["traceEvents"]
        return [e.get("args", {}) for e in events if e.get("name") == "aten::mm"]

    plain = mm_args(RecordingOptions(out=str(tmp_path / "a"), activities=("CPU",)))
    shapes = mm_args(
        RecordingOptions(out=str(tmp_path / "b"), activities=("CPU",), record_shapes=True)
    )
    assert len(plain) == len(shapes) == 2  # one product per recorded step
    assert all("Input Dims" not in args for args in plain)
    assert [args["Input Dims"] for args in shapes] == [[list(x.shape), list(w.shape)]] * 2
