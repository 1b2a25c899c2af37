"""Each integration names the extra to install when its framework is missing (one line)."""

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
