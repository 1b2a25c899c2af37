"""Optional features without their packages: a clear error naming the extra, when they are set up.

Each case runs in a fresh Python whose import system cannot find the package (a ``sys.meta_path``
finder refuses it, as a missing install does), so nothing imported earlier by the suite helps.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.extras import EXTRAS, MissingExtraError, missing_extra

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomllib is new in 3.11; tomli is its backport
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
"""


def run_without(blocked: list[str], body: str) -> str:
    """Run ``body`` where ``blocked`` packages cannot be imported; its stdout (it must succeed)."""
    code = f"BLOCKED = {blocked!r}\n{BLOCKER}\n{CHECK}\n{textwrap.dedent(body)}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


CHECK = """
def expect(make, extra):
    try:
        make()
    except MissingExtraError as exc:
        print(type(exc).__name__, isinstance(exc, ImportError), exc)
        assert f"pip install 'stepscope[{extra}]'" in str(exc), str(exc)
    else:
        raise SystemExit(f"{make} did not fail")
"""


def test_prometheus_exporters_name_their_extra_at_construction() -> None:
    out = run_without(
        ["prometheus_client"],
        """
        from stepscope.extras import MissingExtraError
        from stepscope import metrics
        from stepscope.metrics import *  # the names import; using them is what fails
        from stepscope.metrics import PrometheusEndpoint, PushgatewayExporter

        expect(lambda: PrometheusEndpoint(port=0), "prometheus")
        expect(lambda: metrics.PushgatewayExporter("http://127.0.0.1:9091"), "prometheus")
        expect(lambda: __import__("stepscope.metrics.exporters.prometheus"), "prometheus")
        metrics.JsonlExporter  # the exporters without extras still work
        """,
    )
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "MissingExtraError True PrometheusEndpoint and PushgatewayExporter needs "
        "prometheus_client, which is not installed here (No module named "
        "'prometheus_client'): pip install 'stepscope[prometheus]'"
    )


def test_otlp_exporters_name_their_extra_at_construction() -> None:
    out = run_without(
        ["opentelemetry"],
        """
        from stepscope.extras import MissingExtraError
        from stepscope.metrics import OtelMeterBridge, OtlpExporter

        expect(lambda: OtlpExporter("http://127.0.0.1:4318/v1/metrics"), "otlp")
        expect(lambda: OtelMeterBridge(object()), "otlp")
        """,
    )
    assert out.count("pip install 'stepscope[otlp]'") == 2


def test_otlp_without_the_http_exporter_fails_at_construction_not_at_export() -> None:
    pytest.importorskip("opentelemetry.sdk")
    out = run_without(
        ["opentelemetry.exporter"],
        """
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from stepscope.extras import MissingExtraError
        from stepscope.metrics import OtlpExporter

        expect(lambda: OtlpExporter("http://127.0.0.1:4318/v1/metrics"), "otlp")
        OtlpExporter(exporter=ConsoleMetricExporter())  # an SDK exporter of your own needs no more
        print("own exporter ok")
        """,
    )
    assert "OtlpExporter (OTLP over HTTP) needs opentelemetry-sdk" in out
    assert "opentelemetry.exporter.otlp.proto.http.metric_exporter" in out
    assert out.rstrip().endswith("own exporter ok")


def test_py_spy_backend_names_its_extra(tmp_path: Path) -> None:
    # FunctionProfiler falls back to the in-process sampler when py-spy is missing (by design:
    # profiling never stops the program); stop_at_error=True raises instead.  Both say what to do.
    out = run_without(
        [],
        f"""
        import logging, os, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
        os.environ["PATH"] = {str(tmp_path)!r}           # no py-spy on PATH ...
        sys.executable = {str(tmp_path / "python")!r}    # ... nor beside this Python
        from stepscope.sampling import FunctionProfiler
        from stepscope.sampling.session import BackendUnavailable
        assert FunctionProfiler(backend="py-spy").profile(sum, [1, 2]) == 3
        try:
            FunctionProfiler(backend="py-spy", stop_at_error=True).profile(sum, [1, 2])
        except BackendUnavailable as exc:
            print("raised:", exc)
        """,
    )
    warned, raised = out.splitlines()
    for line in (warned, raised):
        assert "the py-spy backend needs py-spy, which is not installed here" in line
        assert "pip install 'stepscope[sampling]'" in line
    assert warned.endswith("; using the in-process sampler")
    assert raised.startswith("raised: could not start the py-spy sampler")


def test_torch_only_options_name_the_torch_extra() -> None:
    out = run_without(
        ["torch"],
        """
        import stepscope

        asks = ({"record_shapes": True}, {"with_flops": True}, {"step_on": "optimizer"})
        for options in asks:
            try:
                stepscope.profile(**options)
            except ValueError as exc:
                print(exc)
            else:
                raise SystemExit(f"{options} did not fail")
        """,
    )
    lines = out.splitlines()
    assert len(lines) == 3
    assert all("pip install 'stepscope[torch]'" in line for line in lines), lines
    assert "record_shapes" in lines[0] and "with_flops" in lines[1]


def test_every_extra_named_in_messages_exists_in_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, packages in EXTRAS.items():
        assert extra in declared, extra
        for package in packages.split(" and "):
            assert any(req.startswith(package) for req in declared[extra]), (extra, package)
    assert set(EXTRAS) <= set(declared["all"][0].partition("[")[2].rstrip("]").split(","))


def test_missing_extra_refuses_an_unknown_extra() -> None:
    assert isinstance(missing_extra("x", "otlp"), MissingExtraError)
    with pytest.raises(ValueError, match="unknown extra 'prom'"):
        missing_extra("x", "prom")
