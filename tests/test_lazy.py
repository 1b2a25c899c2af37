"""lazy_names: names load on first use and a submodule's import never hides them."""

from __future__ import annotations

import subprocess
import sys


def run_probe(code: str) -> str:
    """Run ``code`` in a fresh interpreter (a clean sys.modules) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


def test_importing_the_profiler_package_loads_no_submodule() -> None:
    out = run_probe(
        "import sys, stepscope.profiler\n"
        "print(sorted(m for m in sys.modules if m.startswith('stepscope.profiler.')))\n"
    )
    assert out.strip() == "[]"


def test_a_submodule_import_keeps_the_public_name() -> None:
    """``import stepscope.profiler.profile`` would bind the module over the class; it must not."""
    out = run_probe(
        "import stepscope.profiler.profile, stepscope.profiler.schedule\n"
        "import stepscope, stepscope.profiler as p\n"
        "from stepscope.profiler import profile, schedule\n"
        "print(isinstance(p.profile, type), callable(schedule), profile is stepscope.profile,\n"
        "      p.schedule is stepscope.schedule, 'profile' in dir(p))\n"
    )
    assert out.split() == ["True"] * 5


def test_an_unknown_name_is_an_attribute_error() -> None:
    out = run_probe(
        "import stepscope.profiler as p\n"
        "try:\n    p.no_such_name\nexcept AttributeError as e:\n    print('AE', e)\n"
    )
    assert "AE module 'stepscope.profiler' has no attribute 'no_such_name'" in out


def test_an_exporter_without_its_extra_is_a_stand_in_that_names_it() -> None:
    """Without prometheus_client the name still imports; constructing it says what to install."""
    out = run_probe(
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if not installed\n"
        "from stepscope import metrics\n"
        "cls = metrics.PrometheusEndpoint\n"
        "try:\n    cls()\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
    )
    assert out.startswith("MissingExtraError") and "stepscope[prometheus]" in out
