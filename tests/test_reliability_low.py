"""Low-severity points of issues 13 and 24: SVG text, construction-time validation, bounded
reads."""

from __future__ import annotations

import gzip
import math
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import stepscope
from stepscope.report.flamegraph import flamegraph_svg, write_flamegraph
from stepscope.sampling import FunctionProfiler
from stepscope.trace.chrome_reader import ChromeTraceError, read_chrome_trace

pytestmark = pytest.mark.implementation_independent


def test_flame_graph_svg_holds_control_characters_and_lone_surrogates(tmp_path: Path) -> None:
    stacks = {'main;caf\udce9\x00\x1b[31m;<leaf & "q">\ufffe': 5, "main;ok": 3}
    path = tmp_path / "f.svg"
    assert write_flamegraph(stacks, path, title="run \x07\ud800") == 5
    root = ET.fromstring(path.read_bytes())  # strict XML parser: raises on invalid XML
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith('<leaf & "q">\ufffd (5 samples') for t in titles)
    assert any(t.startswith("caf\ufffd\ufffd\ufffd[31m") for t in titles)  # surrogate, NUL, ESC
    ET.fromstring(flamegraph_svg(stacks).encode("utf-8"))


@pytest.mark.parametrize("rate", [math.inf, math.nan, -1.0, 0, "100"])
def test_function_profiler_rate_is_checked_at_construction(rate: object) -> None:
    with pytest.raises(ValueError, match="sampling_rate_hz must be a positive, finite number"):
        FunctionProfiler(sampling_rate_hz=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("activities", ["CPU", b"CPU"])
def test_a_single_activity_string_is_refused_with_a_hint(activities: object) -> None:
    hint = r"got b?.CPU. \(a list, e.g. activities=\[ProfilerActivity"
    with pytest.raises(TypeError, match=hint):
        stepscope.profile(activities=activities)  # type: ignore[arg-type]


def test_a_gzip_bomb_is_refused_near_the_limit_in_memory(tmp_path: Path) -> None:
    limit = 32 << 20
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [' + b" " * (4 * limit))
    tracemalloc.start()
    try:
        with pytest.raises(ChromeTraceError, match="inflates to more than"):
            read_chrome_trace(bomb, max_inflated_bytes=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * limit  # it was twice the limit: one inflate call for the whole limit
