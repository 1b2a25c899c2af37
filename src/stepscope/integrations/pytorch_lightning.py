"""``StepscopeProfiler`` for the ``pytorch_lightning`` package (see
``stepscope.integrations.lightning``)."""

from __future__ import annotations

from typing import Any

from stepscope.extras import require
from stepscope.integrations.lightning import profiler_class

__all__: list[str] = []  # StepscopeProfiler: built on first use (module __getattr__)


def __getattr__(name: str) -> Any:
    if name == "StepscopeProfiler":
        module = require("pytorch_lightning.profilers", "StepscopeProfiler", "pytorch-lightning")
        made = globals()["StepscopeProfiler"] = profiler_class(module.Profiler)
        return made
    raise AttributeError(name)
