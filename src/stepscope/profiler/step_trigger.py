"""Automatic steps: advance the profiler after every optimizer step, or every return of a function.

``step_on="optimizer"`` uses torch's global optimizer step post-hook, so any
``torch.optim.Optimizer.step()`` ends a step.  ``step_on="module:qualname"`` (or the function
object itself) wraps that function in place for the duration of the profile; each return ends a
step.  Everything is undone when the profile stops.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["StepTrigger"]


def _resolve(spec: str) -> tuple[Any, str, Any]:
    """(owner, attribute, function) for ``module:qualname``."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(
            f"step_on={spec!r}: expected 'optimizer' or 'module:qualname' "
            "(e.g. 'mytrainer:Trainer.train_step')"
        )
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"step_on={spec!r}: cannot import module {module_name!r}: {exc}") from None
    parts = qualname.split(".")
    for part in parts[:-1]:
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise ValueError(f"step_on={spec!r}: {part!r} not found in {owner!r}") from None
    try:
        fn = owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
    except (KeyError, AttributeError):
        raise ValueError(f"step_on={spec!r}: {parts[-1]!r} not found in {owner!r}") from None
    if not callable(fn) and not isinstance(fn, (staticmethod, classmethod)):
        raise ValueError(f"step_on={spec!r}: {qualname} is not callable")
    return owner, parts[-1], fn


def _spec_of(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function (or bound method), checked to resolve to the same code."""
    target = getattr(fn, "__func__", fn)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if module is None or "<locals>" in qualname or module not in sys.modules:
        raise ValueError(
            f"step_on={fn!r}: cannot patch a function that is not reachable by module and name; "
            "pass step_on='module:qualname' for a function defined at module or class level"
        )
    return f"{module}:{qualname}"


class StepTrigger:
    """Calls ``step`` after every optimizer step or every return of a chosen function."""

    def __init__(self, on: str | Callable[..., Any], step: Callable[[], None]) -> None:
        self._step = step
        self._handle: Any = None
        self._patched: tuple[Any, str, Any] | None = None
        if on == "optimizer":
            self._spec = "optimizer"
            if "torch" not in sys.modules:
                raise ValueError("step_on='optimizer' needs torch: import torch first")
        elif isinstance(on, str):
            self._spec = on
            _resolve(on)  # fail early with a clear message
        elif callable(on):
            self._spec = _spec_of(on)
            _resolve(self._spec)
        else:
            raise TypeError(
                f"step_on must be 'optimizer', 'module:qualname' or a function, got {on!r}"
            )

    def install(self) -> None:
        """Start triggering steps."""
        if self._spec == "optimizer":
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._handle = register_optimizer_step_post_hook(self._after_optimizer_step)
            return
        owner, attr, original = _resolve(self._spec)
        func = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
        step = self._step

        @functools.wraps(func)
        def stepping(*args: Any, **kwargs: Any) -> Any:
            result = func(*args, **kwargs)
            step()
            return result

        replacement: Any = stepping
        if isinstance(original, staticmethod):
            replacement = staticmethod(stepping)
        elif isinstance(original, classmethod):
            replacement = classmethod(stepping)
        setattr(owner, attr, replacement)
        self._patched = (owner, attr, original)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step()

    def remove(self) -> None:
        """Stop triggering steps and restore what was patched."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._patched is not None:
            owner, attr, original = self._patched
            setattr(owner, attr, original)
            self._patched = None
