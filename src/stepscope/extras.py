"""Optional dependencies: which extra provides what, and the error that says how to install it.

Features that need a package stepscope does not depend on (prometheus_client, the OpenTelemetry
SDK, py-spy, torch) raise :class:`MissingExtraError` when they are set up without it, naming
the extra to install: ``pip install 'stepscope[prometheus]'``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "EXTRAS",
    "MissingExtraError",
    "missing_extra",
    "require",
    "torch_available",
    "torch_installed",
    "unavailable_class",
]

EXTRAS = {
    "prometheus": "prometheus_client",
    "otlp": "opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http",
    "sampling": "py-spy",
    "torch": "torch",
    "parquet": "pyarrow and duckdb",
    "ray": "ray",
    "lightning": "lightning",
    "pytorch-lightning": "pytorch-lightning",
    "transformers": "transformers and accelerate",
    "mlflow": "mlflow-skinny",
    "perfetto": "perfetto and protobuf",
    "fast": "zlib-ng",
}
"""Each extra of ``pyproject.toml`` and what it installs."""


class MissingExtraError(ImportError):
    """A feature was set up without the optional package it needs."""


def missing_extra(feature: str, extra: str, detail: str = "") -> MissingExtraError:
    """The error for ``feature`` used without the packages of ``extra``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {sorted(EXTRAS)}")
    why = f" ({detail})" if detail else ""
    return MissingExtraError(
        f"{feature} needs {EXTRAS[extra]}, which is not installed here{why}: "
        f"pip install 'stepscope[{extra}]'"
    )


def require(module: str, feature: str, extra: str) -> Any:
    """Import ``module``, or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing_extra(feature, extra, f"cannot import {module}: {exc}") from exc


def unavailable_class(name: str, error: MissingExtraError) -> type:
    """A stand-in for class ``name`` whose construction raises ``error`` (import stays cheap)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise MissingExtraError(str(error)) from error.__cause__

    init: Callable[..., NoReturn] = __init__
    return type(name, (), {"__init__": init, "__doc__": f"Unavailable here: {error}"})


def torch_available() -> bool:
    """Whether the running program has imported torch (stepscope never imports it first)."""
    return sys.modules.get("torch") is not None


def torch_installed() -> bool:
    """Whether torch is imported or importable here (found without importing it)."""
    if torch_available():
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False
