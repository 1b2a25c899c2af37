"""report, diff and merge under hostile traces and output paths: a report or one line, never more.

Each test runs the real command in a child process (``python -m stepscope``) and checks its
exit status, its stderr (one line, no traceback) and its output against the trace it wrote.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.reliability_helpers import fill, small_tmpfs

STEP_US = 1000


def hostile_trace(
    names: list[str], steps: int = 3, step_us: int = STEP_US, **extra: Any
) -> dict[str, Any]:
    """``steps`` ProfilerStep spans of ``step_us``, each holding a 5 us op per name."""
    events: list[dict[str, Any]] = []
    for s in range(steps):
        t = s * (step_us + 10)
        events.append(
            {"ph": "X", "name": f"ProfilerStep#{s}", "ts": t, "dur": step_us, "pid": 1, "tid": 1}
        )
        events += [
            {"ph": "X", "name": n, "ts": t + 10 + i, "dur": 5, "pid": 1, "tid": 1, "cat": "cpu_op"}
            for i, n in enumerate(names)
        ]
    return {"traceEvents": events, **extra}


def write(path: Path, trace: dict[str, Any]) -> Path:
    """``trace`` as JSON at ``path`` (lone surrogates kept as ``\\udXXX`` escapes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace), encoding="ascii")
    return path


def stepscope(
    *args: str | Path, limit_bytes: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """Run the real command line in a child, with colour forced on as on a terminal."""
    env = dict(os.environ, FORCE_COLOR="1", COLUMNS="200")

    def cap() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "stepscope", *map(str, args)],
        capture_output=True,
        env=env,
        timeout=timeout,
        preexec_fn=cap,
    )


def one_line_error(done: subprocess.CompletedProcess[bytes]) -> str:
    """The single stderr line of a failed command (fails on a traceback or several lines)."""
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_huge_rank_range_is_refused_in_one_line_under_a_memory_cap(tmp_path: Path) -> None:
    write(tmp_path / "d" / "host_rank0.json", hostile_trace(["a"]))
    out = tmp_path / "m.json"
    for ranks, says in [("0-99999999999", "beyond the largest rank"), ("0-2000000", "more than")]:
        done = stepscope("merge", tmp_path / "d", "-o", out, "--ranks", ranks, limit_bytes=3 << 30)
        assert says in one_line_error(done)
    assert not out.exists()
    done = stepscope("merge", tmp_path / "d", "-o", out, "--ranks", "0-3", limit_bytes=3 << 30)
    assert done.returncode == 0, done.stderr.decode()


def test_negative_durations_leave_the_other_files_reported(tmp_path: Path) -> None:
    write(tmp_path / "d" / "good.json", hostile_trace(["a"], step_us=2000))
    bad = hostile_trace(["b"], step_us=-50)  # valid JSON: every step and one op negative
    bad["traceEvents"].append({"ph": "X", "name": "n", "ts": 3, "dur": -9, "pid": 1, "tid": 1})
    write(tmp_path / "d" / "bad.json", bad)
    commands: list[list[str | Path]] = [
        ["report", tmp_path / "d"],
        ["diff", tmp_path / "d", tmp_path / "d"],
    ]
    for command in commands:
        done = stepscope(*command, "--json", tmp_path / "out.json")
        assert done.returncode == 0, done.stderr.decode()
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["step"]["a_median_ns"] > 0
    done = stepscope("report", tmp_path / "d", "--json", tmp_path / "r.json")
    files = {f["source"]: f for f in json.loads((tmp_path / "r.json").read_text())["files"]}
    # the good file's steps are exactly those written: 2000 us each
    assert [s["dur_ns"] for s in files["good.json"]["steps"]] == [2_000_000] * 3
    assert all(s["dur_ns"] >= 0 for s in files["bad.json"]["steps"])


def test_a_file_whose_analysis_fails_is_named_and_the_rest_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.analysis import analyze as analyze_module
    from stepscope.analysis import host
    from stepscope.trace.loading import load_traces

    write(tmp_path / "d" / "good.json", hostile_trace(["a"]))
    write(tmp_path / "d" / "other.json", hostile_trace(["b"]))
    with open(os.devnull, "w") as devnull:
        traces, failures = load_traces(tmp_path / "d", devnull)
    broken = traces[1][1]
    real = host.host_breakdowns

    def fails_on_one(trace: Any, *args: Any) -> Any:  # the ZeroDivisionError of a bad trace
        if trace is broken:
            return 1 // 0
        return real(trace, *args)

    monkeypatch.setattr(host, "host_breakdowns", fails_on_one)
    report = analyze_module.analyze(traces, None, 10, failures)
    assert [s.source for s in report.files] == ["good.json"]
    assert failures == [
        "other.json: cannot analyse: ZeroDivisionError: integer division or modulo by zero"
    ]
    with pytest.raises(ValueError, match=r"no trace could be analysed: other\.json"):
        analyze_module.analyze(traces[1:], None, 10, [])
    with pytest.raises(ZeroDivisionError):
        analyze_module.analyze(traces, None, 10)


ESCAPES = "\x1b]0;pwned\x07\x1b[2Jforged\u202e"


@pytest.mark.parametrize("command", ["report", "diff"])
def test_escapes_markup_and_surrogates_never_reach_the_terminal_raw(
    tmp_path: Path, command: str
) -> None:
    names = [ESCAPES, "lone \ud800 surrogate", "[/bold] not markup [red]"]
    trace = write(tmp_path / "t.json", hostile_trace(names))
    args = (
        [trace] if command == "report" else [trace, write(tmp_path / "u.json", hostile_trace([]))]
    )
    done = stepscope(command, *args)
    out = done.stdout.decode("utf-8")  # strict: fails on a surrogate
    assert done.returncode == 0, done.stderr.decode()
    assert "\x1b[" in out  # colour is on, as on a terminal
    for raw in ("\x1b]", "\x1b[2J", "\x07", "\u202e"):
        assert raw not in out
    for shown in ("\\x1b]0;pwned\\x07\\x1b[2Jforged\\u202e", "lone \ufffd surrogate", "[/bold]"):
        assert shown in out


def test_error_lines_show_escapes_in_file_names_printable(tmp_path: Path) -> None:
    missing = tmp_path / "\x1b[2Jgone.json"
    line = one_line_error(stepscope("report", missing))
    assert "\x1b" not in line and "\\x1b[2Jgone.json" in line


def test_deep_stacks_give_an_html_report(tmp_path: Path) -> None:
    from stepscope.report.html import CUT_FRAMES, MAX_FLAME_DEPTH

    step = {"ph": "X", "name": "ProfilerStep#0", "ts": 0, "dur": 100_000, "pid": 1, "tid": 1}
    nested = [  # 700 nested distinct frames, as a 700-deep mutual recursion with_stack gives
        {"ph": "X", "name": f"f{d}", "ts": 1 + d, "dur": 90_000 - 2 * d, "pid": 1, "tid": 1}
        | {"cat": "python_function"}
        for d in range(700)
    ]
    frames = {str(i): {"name": f"g{i}"} | ({"parent": str(i - 1)} if i else {}) for i in range(600)}
    samples = [{"ts": 10 + i, "sf": "599", "tid": 1, "pid": 1, "weight": 1} for i in range(5)]
    write(tmp_path / "spans.json", {"traceEvents": [step, *nested]})
    write(
        tmp_path / "frames.json", {"traceEvents": [step], "stackFrames": frames, "samples": samples}
    )
    for name in ("spans", "frames"):
        page = tmp_path / f"{name}.html"
        done = stepscope("report", tmp_path / f"{name}.json", "--html", page)
        assert done.returncode == 0, done.stderr.decode()
        html = page.read_text()
        assert CUT_FRAMES in html and f'"f{MAX_FLAME_DEPTH}"' not in html


def test_an_output_path_that_is_a_device_link_stays_a_link(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.json", hostile_trace(["a"]))
    link = tmp_path / "out"
    link.symlink_to("/proc/self/fd/1")  # what /dev/stdout is
    done = stepscope("report", trace, "--json", link)
    assert done.returncode == 0 and link.is_symlink()
    assert b'"schema": "stepscope.report' in done.stdout
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "to_real").symlink_to(real)
    assert stepscope("report", trace, "--json", tmp_path / "to_real").returncode == 0
    assert (tmp_path / "to_real").is_symlink() and real.read_text().startswith("{")
    line = one_line_error(stepscope("report", trace, "--json", tmp_path))
    assert "it is a directory" in line and ".tmp" not in line


def test_parquet_refuses_steps_beyond_int64_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    trace = hostile_trace(["a"])
    trace["traceEvents"][0]["name"] = f"ProfilerStep#{10**30}"
    path = write(tmp_path / "t.json", trace)
    done = stepscope("report", path, "--parquet", tmp_path / "pq", "--json", tmp_path / "r.json")
    line = done.stderr.decode().strip().splitlines()[-1]
    assert (
        done.returncode == 1 and "cannot hold" in line and "Traceback" not in done.stderr.decode()
    )
    assert not (tmp_path / "pq").exists()
    steps = json.loads((tmp_path / "r.json").read_text())["combined"]["steps"]
    assert 10**30 in [s["step"] for s in steps]  # JSON holds it


def test_parquet_on_a_full_disk_keeps_the_earlier_set_whole(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    first = write(tmp_path / "one" / "a.json", hostile_trace(["a"]))
    second = write(tmp_path / "two" / "b.json", hostile_trace([f"op{i}" for i in range(2000)]))
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "pq"
        assert stepscope("report", first, "--parquet", out).returncode == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        fill(disk, leave=16 << 10)
        done = stepscope("report", second, "--parquet", out)
        assert done.returncode == 1, (done.stdout[-2000:], done.stderr)
        line = done.stderr.decode().strip().splitlines()[-1]
        assert str(out) in line and "Traceback" not in done.stderr.decode()
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        runs = {
            run for name in before for run in pq.read_table(out / name).column("run").to_pylist()
        }
        assert runs == {"a.json"}  # the first run's set, whole


def test_a_link_loop_named_like_a_trace_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "d" / "good.json", hostile_trace(["a"]))
    (tmp_path / "d" / "self.json").symlink_to("self.json")
    done = stepscope("report", tmp_path / "d")
    assert done.returncode == 1 and "skipped" in done.stderr.decode()
    assert "self.json" in done.stderr.decode()
    line = one_line_error(stepscope("report", tmp_path / "d" / "self.json"))
    assert "leads nowhere" in line


def test_merge_skips_its_own_output_and_notes_a_rank_claimed_twice(tmp_path: Path) -> None:
    d = tmp_path / "d"
    write(d / "a_rank0.json", hostile_trace(["a"], distributedInfo={"rank": 0}))
    write(d / "b_rank1.json", hostile_trace(["a"], distributedInfo={"rank": 1}))
    for _ in range(2):
        done = stepscope("merge", d, "-o", d / "merged.json")
        assert done.returncode == 0, done.stderr.decode()
        assert "2 files of 2 ranks" in done.stderr.decode()
    write(d / "c_rank1.json", hostile_trace(["b"], distributedInfo={"rank": 1}))
    done = stepscope("merge", d, "-o", tmp_path / "m.json")
    assert "rank 1 is claimed by files whose times overlap (b_rank1.json, c_rank1.json)" in (
        done.stderr.decode()
    )


def test_diff_notes_runs_with_different_rank_counts(tmp_path: Path) -> None:
    write(tmp_path / "a" / "x_rank0.json", hostile_trace(["a"]))
    for rank in range(2):
        write(tmp_path / "b" / f"x_rank{rank}.json", hostile_trace(["a"]))
    done = stepscope("diff", tmp_path / "a", tmp_path / "b", "--json", tmp_path / "d.json")
    assert done.returncode == 0, done.stderr.decode()
    notes = json.loads((tmp_path / "d.json").read_text())["notes"]
    assert any("A has files of 1 rank(s), B of 2" in n for n in notes)


def test_a_stopped_or_partial_sampler_is_said_in_the_report(tmp_path: Path) -> None:
    sampler = {"sigprof_replaced_during_run": True, "lost_threads_without_slot": 39}
    path = write(tmp_path / "t.json", hostile_trace(["a"], stepscope_sampler=sampler))
    done = stepscope("report", path, "--json", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr.decode()
    notes = json.loads((tmp_path / "r.json").read_text())["combined"]["notes"]
    assert any("its own SIGPROF handler" in n for n in notes)
    assert any(n.startswith("39 threads were not sampled") for n in notes)
    summary = json.loads((tmp_path / "r.json").read_text())["combined"]
    assert summary["dropped"]["sampler_lost_threads_without_slot"] == 39


def test_json_on_a_full_disk_keeps_the_old_file_and_names_the_output(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.json", hostile_trace([f"op{i}" for i in range(3000)]))
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "r.json"
        out.write_text("old")
        fill(disk, leave=8 << 10)
        done = stepscope("report", trace, "--json", out)
        line = done.stderr.decode().strip().splitlines()[-1]
        assert done.returncode == 1 and "Traceback" not in done.stderr.decode()
        assert f"cannot write JSON report {str(out)!r}: No space left on device" in line
        assert out.read_text() == "old"
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "r.json"]  # no temporary
