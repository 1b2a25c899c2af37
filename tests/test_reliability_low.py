"""Low-severity points of issue 13: SVG text, construction-time validation."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stepscope.report.flamegraph import flamegraph_svg, write_flamegraph
from stepscope.sampling import FunctionProfiler


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
        FunctionProfiler(sample_rate_hz=rate)  # type: ignore[arg-type]
