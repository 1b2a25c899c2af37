"""``log_report`` into a real local MLflow tracking store (a file store in the test's dir).

The step metrics read back from MLflow are compared with the step spans the test reads from
the written trace itself; the artifacts with the Markdown and JSON the report renders.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.report.markdown import report_markdown
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.integration_helpers import step_spans

pytestmark = pytest.mark.slow

mlflow = pytest.importorskip("mlflow")


def _run(directory: Path) -> Path:
    # five unrecorded steps (the first is cold): enough for the overhead to be stated
    sched = stepscope.schedule(wait=5, warmup=1, active=3, repeat=1)
    handler = stepscope.trace_handler(directory, worker_name="run")
    with stepscope.profile(schedule=sched, on_trace_ready=handler, torch_ops=False) as prof:
        for _ in range(10):
            with stepscope.record_function("forward"):
                time.sleep(0.002)
            prof.step()
    (found,) = directory.iterdir()
    return found


def test_step_metrics_and_the_summary_reach_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.integrations.mlflow import log_report

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the local store without a database
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    trace_file = _run(tmp_path / "traces")
    experiment = mlflow.create_experiment("stepscope-test")
    with mlflow.start_run(experiment_id=experiment) as run:
        assert log_report(trace_file) == run.info.run_id
    client = mlflow.MlflowClient()
    history = client.get_metric_history(run.info.run_id, "stepscope.step_ms")
    by_step = {m.step: m.value for m in history}
    spans = step_spans(read_chrome_trace(trace_file))
    assert sorted(by_step) == [s[0] for s in spans] == [6, 7, 8]
    for step, lo, hi, _ in spans:
        assert by_step[step] == pytest.approx((hi - lo) / 1e6, rel=1e-6)
    forward = client.get_metric_history(run.info.run_id, "stepscope.host.forward_ms")
    assert len(forward) == 3 and all(0 < m.value <= by_step[m.step] for m in forward)
    data = client.get_run(run.info.run_id).data.metrics
    assert data["stepscope.steps"] == 3
    assert "stepscope.overhead_pct" in data
    report = analyze([(trace_file.name, read_chrome_trace(trace_file))])
    artifacts = Path(client.download_artifacts(run.info.run_id, "stepscope", str(tmp_path / "dl")))
    assert (artifacts / "summary.md").read_text(encoding="utf-8") == report_markdown(report)
    logged = json.loads((artifacts / "report.json").read_text(encoding="utf-8"))
    assert logged["combined"]["steps"] == json.loads(report.to_json())["combined"]["steps"]


def test_without_a_run_the_error_says_what_to_do(tmp_path: Path) -> None:
    from stepscope.integrations.mlflow import log_report

    trace_file = _run(tmp_path / "traces")
    assert mlflow.active_run() is None
    with pytest.raises(ValueError, match="no active MLflow run"):
        log_report(trace_file)


def _readme_example() -> str:
    """The README's MLflow example, as written there."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**MLflow**") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_readme_example_runs_with_the_installed_mlflow(tmp_path: Path) -> None:
    """Issue 36, item 7: the example failed on MLflow 3.17 (its default store needs the full
    mlflow; a file store needs MLFLOW_ALLOW_FILE_STORE=true)."""
    import os
    import subprocess
    import sys

    _run(tmp_path / "traces")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run(
        [sys.executable, "-c", _readme_example()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check = (
        "import os, mlflow\n"
        "os.environ['MLFLOW_ALLOW_FILE_STORE'] = 'true'\n"
        "mlflow.set_tracking_uri('file:./mlruns')\n"
        "(run,) = mlflow.search_runs(search_all_experiments=True, output_format='list')\n"
        "print(sorted(m.step for m in mlflow.MlflowClient().get_metric_history("
        "run.info.run_id, 'stepscope.step_ms')))\n"
    )
    read = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr[-3000:]
    assert read.stdout.strip() == "[6, 7, 8]", read.stdout


def test_a_store_mlflow_refuses_gets_an_error_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.integrations.mlflow import log_report

    trace_file = _run(tmp_path / "traces")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "refused").as_uri())
    try:
        with pytest.raises(RuntimeError, match="MLFLOW_ALLOW_FILE_STORE=true") as caught:
            log_report(trace_file, run_id="0" * 32)
    finally:
        mlflow.set_tracking_uri(before)
    assert "set_tracking_uri" in str(caught.value)


def test_names_with_unpaired_surrogates_reach_the_run_as_valid_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.integrations.mlflow import log_report
    from tests.test_report_surrogates import hostile_trace

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    trace_file = hostile_trace(tmp_path / "t.pt.trace.json")
    experiment = mlflow.create_experiment("stepscope-surrogates")
    with mlflow.start_run(experiment_id=experiment) as run:
        log_report(trace_file)
    client = mlflow.MlflowClient()
    artifacts = Path(client.download_artifacts(run.info.run_id, "stepscope", str(tmp_path / "dl")))
    assert "op\ufffdx" in (artifacts / "summary.md").read_bytes().decode("utf-8")
    logged = json.loads((artifacts / "report.json").read_bytes().decode("utf-8"))
    assert [op["name"] for op in logged["combined"]["operators"]] == ["op\ufffdx"]
    assert logged["text_replaced"] == 2
