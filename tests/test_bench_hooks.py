"""The benchmarks' native hooks (``bench/hooks``) build on their own and work.

They are kept out of the package's extension: the tracer's floor (a no-op profile function on
3.10/3.11, a no-op ``sys.monitoring`` callback on 3.12+) and reads of the tracer's clock, with
``clock.c`` compiled in from the package's sources.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from stepscope._ext import native

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.  The
# child that runs the hooks is given its environment (the package's own choice of implementation).
pytestmark = [pytest.mark.slow, pytest.mark.native, pytest.mark.implementation_independent]

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import json, sys
import _bench_hooks as hooks
from stepscope import clock

tsc = hooks._clock_configure(clock.SOURCE == "tsc")
ours, theirs = hooks.now_ns(), clock.now_ns()
reads = hooks.clock_reads(10_000)
if sys.version_info < (3, 12):
    hooks.floor_profile(True)
    sum(abs(i) for i in range(1000))
    hooks.floor_profile(False)
    floor = "profile"
else:
    mon = sys.monitoring
    mon.use_tool_id(4, "bench-floor")
    mon.register_callback(4, mon.events.PY_START, hooks.mon_noop)
    mon.set_events(4, mon.events.PY_START)
    sum(abs(i) for i in range(1000))
    mon.set_events(4, 0)
    back = mon.register_callback(4, mon.events.PY_START, None)
    mon.free_tool_id(4)
    floor = "monitoring" if back is hooks.mon_noop else "lost"
print(json.dumps({"tsc": tsc, "gap_ns": abs(ours - theirs), "reads": reads, "floor": floor}))
"""


def test_the_hooks_build_apart_from_the_extension_and_work(tmp_path: Path) -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler here ({compiler})")
    build = [
        sys.executable,
        str(ROOT / "bench" / "hooks" / "build.py"),
        "--build-lib",
        str(tmp_path),
    ]
    done = subprocess.run(build, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert [p.name.split(".")[0] for p in tmp_path.glob("*.so")] == ["_bench_hooks"]
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["reads"] in (0, 1)
    assert found["floor"] == ("profile" if sys.version_info < (3, 12) else "monitoring")
    # the compiled-in clock reads what stepscope's clock reads (the two calls ~µs apart)
    assert found["gap_ns"] < 50_000_000, found
    # and the package's extension has none of them
    mod = native()
    if mod is not None:
        assert not {"_floor_profile", "_bench_clock_reads", "_mon_noop"} & set(dir(mod))
