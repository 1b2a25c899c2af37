"""The one clock: monotonic, aligned with CLOCK_MONOTONIC, and a fixed wall base."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stepscope import clock
from stepscope._ext import native

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native


def test_now_ns_is_monotonic_and_close_to_clock_monotonic() -> None:
    readings = [clock.now_ns() for _ in range(10_000)]
    assert readings == sorted(readings)
    # Same time base as CLOCK_MONOTONIC (TSC calibration is anchored to it).
    assert abs(clock.now_ns() - time.monotonic_ns()) < 5_000_000


def test_elapsed_time_matches_the_system_clock() -> None:
    a, m0 = clock.now_ns(), time.monotonic_ns()
    time.sleep(0.05)
    b, m1 = clock.now_ns(), time.monotonic_ns()
    assert abs((b - a) - (m1 - m0)) < 1_000_000


def test_wall_base_converts_to_unix_time() -> None:
    unix = clock.to_unix_ns(clock.now_ns())
    assert abs(unix - time.time_ns()) < 50_000_000
    assert clock.wall_base_ns() == clock.wall_base_ns()


def test_ticks_convert_to_now() -> None:
    t = clock.ticks()
    converted = clock.ticks_to_ns(t)
    assert abs(converted - clock.now_ns()) < 5_000_000


def test_refine_keeps_time_continuous() -> None:
    before = clock.now_ns()
    clock.refine()
    after = clock.now_ns()
    assert after >= before


def test_clock_info_names_the_source() -> None:
    info = clock.clock_info()
    assert info["source"] == clock.SOURCE
    assert clock.SOURCE in {"tsc", "clock_monotonic", "python_monotonic"}
    if clock.SOURCE == "tsc":
        assert int(str(info["tsc_hz"])) > 100_000_000


@pytest.mark.implementation_independent
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STEPSCOPE_IMPLEMENTATION": "python"}, "python_monotonic"),
        ({"STEPSCOPE_CLOCK": "monotonic"}, "clock_monotonic"),
    ],
)
def test_source_can_be_forced(env: dict[str, str], expected: str) -> None:
    if expected == "clock_monotonic" and native() is None:
        pytest.skip("C extension not built")
    out = subprocess.run(
        [sys.executable, "-c", "from stepscope import clock; print(clock.SOURCE, clock.now_ns())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == expected
    assert abs(int(out[1]) - time.monotonic_ns()) < 10_000_000_000
