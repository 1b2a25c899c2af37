"""The integrations' shared behaviour: the extra named when a framework is missing (one
line), one trace file per rank, failures kept out of the training loop."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from stepscope.extras import MissingExtraError


@pytest.mark.parametrize(
    ("module", "name", "framework", "extra"),
    [
        ("stepscope.integrations.lightning", "StepscopeProfiler", "lightning", "lightning"),
        (
            "stepscope.integrations.pytorch_lightning",
            "StepscopeProfiler",
            "pytorch_lightning",
            "pytorch-lightning",
        ),
        (
            "stepscope.integrations.transformers",
            "StepscopeCallback",
            "transformers",
            "transformers",
        ),
    ],
)
def test_a_missing_framework_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, name: str, framework: str, extra: str
) -> None:
    integration = importlib.import_module(module)
    for loaded in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.setitem(sys.modules, loaded, None)
    monkeypatch.setitem(sys.modules, framework, None)
    with pytest.raises(MissingExtraError) as caught:
        integration.__getattr__(name)
    message = str(caught.value)
    assert f"pip install 'stepscope[{extra}]'" in message and "\n" not in message


def test_mlflow_missing_names_its_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stepscope.integrations.mlflow import log_report

    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'stepscope\[mlflow\]'"):
        log_report(tmp_path)


def test_each_rank_writes_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stepscope
    from stepscope.integrations.session import TrainingSession

    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        session = TrainingSession(
            tmp_path,
            stepscope.schedule(wait=0, warmup=1, active=2, repeat=1),
            {"torch_ops": False},
        )
        session.start()
        for _ in range(4):
            session.step()
        session.stop()
        assert len(session.trace_files) == 1 and f"_rank{rank}." in session.trace_files[0]
    assert len(list(tmp_path.iterdir())) == 2


def test_a_failing_region_never_reaches_the_training_loop(tmp_path: Path) -> None:
    import stepscope
    from stepscope.failures import failure_log
    from stepscope.integrations.session import TrainingSession

    session = TrainingSession(tmp_path, stepscope.schedule(wait=0, warmup=1, active=1), {})
    session.start()
    before = failure_log("integrations").counts().get("integration_error", 0)
    session.enter(None, "x")  # type: ignore[arg-type]  # not a name: record_function refuses
    session.leave("x")
    session.step()
    session.stop()
    assert failure_log("integrations").counts()["integration_error"] == before + 1
