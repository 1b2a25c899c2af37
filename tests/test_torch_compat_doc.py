"""docs/torch-compat.md stays true: every name in it imports; no public torch name is missing."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.implementation_independent

DOC = Path(__file__).resolve().parent.parent / "docs" / "torch-compat.md"
ROW = re.compile(r"^\| `(torch\.[\w.]+)` \| (?:`(stepscope[\w.]*)`|—) \|")


def rows() -> list[tuple[str, str | None]]:
    found = [m.groups() for line in DOC.read_text().splitlines() if (m := ROW.match(line))]
    return [(torch_name, ours) for torch_name, ours in found]


def resolve(dotted: str) -> Any:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _defined_in(value: Any, module_name: str) -> bool:
    """A public value of the module itself: its functions and classes, its counters and tables."""
    if inspect.ismodule(value):
        return False
    if callable(value) and not isinstance(value, (list, dict)):
        return getattr(value, "__module__", None) == module_name
    return isinstance(value, (int, float, list, dict)) and not isinstance(value, bool)


def test_every_stepscope_counterpart_imports() -> None:
    listed = rows()
    assert len(listed) > 60
    for _, ours in listed:
        if ours is not None:
            assert resolve(ours) is not None, ours


def test_every_torch_name_listed_exists_and_every_public_one_is_listed() -> None:
    pytest.importorskip("torch")
    listed = {name for name, _ in rows()}
    for name in listed:
        resolve(name)
    modules = {
        "torch.profiler": None,
        "torch.distributed.elastic.metrics.api": None,
        "torch._inductor.metrics": None,
    }
    for module_name in modules:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", None) or [
            n for n, value in vars(module).items() if _defined_in(value, module_name)
        ]
        for name in public:
            if name.startswith("_"):
                continue
            assert f"{module_name}.{name}" in listed, f"{module_name}.{name} is not in the doc"
