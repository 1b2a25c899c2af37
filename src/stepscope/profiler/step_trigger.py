"""Automatic steps: advance the profiler after every optimizer step, or every return of a function.

``step_on="optimizer"`` listens to torch's global optimizer step post-hook (through
``collectors/optimizer_hook.py``, whose one hook is never removed: a window starts and stops
inside that hook's loop), so any ``torch.optim.Optimizer.step()`` ends a step (the listener goes in
as soon as the program has imported torch, so the profile may be created first).
``step_on="module:qualname"`` (or the function object itself) wraps that function in place for
the duration of the profile; each return ends a step.  Everything is undone when the profile stops.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import weakref
from collections.abc import Callable
from typing import Any

from stepscope.collectors import import_watch, optimizer_hook
from stepscope.extras import torch_installed

__all__ = ["MAX_OPTIMIZERS", "StepTrigger"]

MAX_OPTIMIZERS = 64
"""Distinct optimizers a trigger tells apart (a program that builds one per batch stops there)."""


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


def names_program_function(spec: str, program_module: str) -> bool:
    """Whether ``module:qualname`` names a function of the program running as ``__main__``."""
    return spec.partition(":")[0] in (program_module, "__main__")


def _stepping(original: Any, step: Callable[[], None]) -> Any:
    """A replacement for ``original`` (function, staticmethod or classmethod) that steps after."""
    func = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original

    @functools.wraps(func)
    def stepping(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        step()
        return result

    if isinstance(original, staticmethod):
        return staticmethod(stepping)
    if isinstance(original, classmethod):
        return classmethod(stepping)
    return stepping


class StepTrigger:
    """Calls ``step`` after every optimizer step or every return of a chosen function.

    ``program_module`` names the module of the program being run as ``__main__`` (the script's
    stem under ``stepscope run``): a ``module:qualname`` there (or in ``__main__``) is not
    imported — that would run the program a second time — but wrapped when the program defines
    it, through :meth:`bound`.
    """

    def __init__(
        self,
        on: str | Callable[..., Any],
        step: Callable[[], None],
        *,
        program_module: str | None = None,
        strict: bool | None = None,
    ) -> None:
        self._step = step
        self._strict = strict
        """Whether a failing step re-raises into the optimizer step (None: config.strict)."""
        self._listening = False
        self.in_program: str | None = None
        """The qualname to wrap when the running program defines it (see ``program_module``)."""
        self._waiting = False
        self.wrapped = False
        """Whether a function of the running program was wrapped (see ``bound``)."""
        self._patched: tuple[Any, str, Any] | None = None
        self._optimizers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        if on == "optimizer":
            self._spec = "optimizer"
            if not torch_installed():
                raise ValueError(
                    "step_on='optimizer' needs torch, which is not installed here "
                    "(pip install 'stepscope[torch]')"
                )
        elif isinstance(on, str):
            self._spec = on
            qualname = on.partition(":")[2]
            if program_module is not None and names_program_function(on, program_module):
                if not qualname:
                    _resolve(on)  # the message for a malformed spec
                self.in_program = qualname
            else:
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
            self._waiting = True
            optimizer_hook.ensure_registered()  # before any hook loop can be running
            import_watch.when_imported("torch", self._hook_optimizer)
            return
        if self.in_program is not None:
            return  # wrapped by bound() when the program defines it
        owner, attr, original = _resolve(self._spec)
        setattr(owner, attr, _stepping(original, self._step))
        self._patched = (owner, attr, original)

    def bound(self, namespace: dict[str, Any], name: str) -> None:
        """The program's top level bound ``name``: wrap the target if it is (or holds) it."""
        if self.in_program is None:
            return
        parts = self.in_program.split(".")
        if parts[0] != name or name not in namespace:
            return
        if len(parts) == 1:
            namespace[name] = _stepping(namespace[name], self._step)
            self.wrapped = True
            return
        owner: Any = namespace[name]
        try:
            for part in parts[1:-1]:
                owner = getattr(owner, part)
            original = (
                owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
            )
        except (AttributeError, KeyError):
            return
        setattr(owner, parts[-1], _stepping(original, self._step))
        self.wrapped = True

    def _hook_optimizer(self) -> None:
        self._waiting = False
        optimizer_hook.add_listener(self._after_optimizer_step, strict=self._strict)
        self._listening = True

    def _after_optimizer_step(self, optimizer: Any) -> None:
        # an optimizer that cannot be weakly referenced is not counted
        with contextlib.suppress(TypeError):
            if optimizer not in self._optimizers and len(self._optimizers) < MAX_OPTIMIZERS:
                self._optimizers[optimizer] = type(optimizer).__name__
        self._step()

    @property
    def spec(self) -> str:
        """What ends a step: ``optimizer`` or ``module:qualname``."""
        return self._spec

    def optimizers(self) -> list[str]:
        """The class names of the live optimizers whose steps have ended steps, oldest first."""
        return list(self._optimizers.values())

    def remove(self) -> None:
        """Stop triggering steps and restore what was patched."""
        if self._waiting:
            self._waiting = False
            import_watch.cancel("torch", self._hook_optimizer)
        if self._listening:
            optimizer_hook.remove_listener(self._after_optimizer_step)
            self._listening = False
        if self._patched is not None:
            owner, attr, original = self._patched
            setattr(owner, attr, original)
            self._patched = None
