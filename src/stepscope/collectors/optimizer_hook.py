"""One optimizer step pre-hook and one post-hook per process, registered once, never removed.

torch calls its global optimizer step post-hooks by iterating an ``OrderedDict``; adding or
removing a hook while that loop runs (a window that starts or stops inside a hook, because the
step ended there) makes torch raise ``RuntimeError: OrderedDict mutated during iteration`` in the
user's ``optimizer.step()``.  So stepscope registers a single dispatcher with torch, at a moment
no hook can be running (right after torch is imported, or when a profile is built), and never
removes it; stepscope's parts add and remove *listeners* here instead, which are kept in a tuple
replaced on every change, so the dispatcher's loop never sees its list change under it.  With no
listener each dispatcher costs one Python call per optimizer step.  Listeners added with
``before=True`` run before the step (torch's pre-hooks), the others after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stepscope.collectors import import_watch
from stepscope.failures import failure_log

__all__ = [
    "OptimizerListener",
    "add_listener",
    "ensure_registered",
    "listening",
    "remove_listener",
]

OptimizerListener = Callable[[Any], None]
"""Called with the optimizer after each ``Optimizer.step()``."""

_Listeners = tuple[tuple[OptimizerListener, bool | None], ...]
_listeners: _Listeners = ()
_pre_listeners: _Listeners = ()
_lock = threading.Lock()
_registered = False
_waiting = False
_failures = failure_log("collectors")


def _dispatch(optimizer: Any, args: Any, kwargs: Any) -> None:
    _call(_listeners, optimizer)


def _dispatch_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    _call(_pre_listeners, optimizer)


def _call(listeners: _Listeners, optimizer: Any) -> None:
    for listener, strict in listeners:
        try:
            listener(optimizer)
        except Exception as exc:
            _failures.report(
                "optimizer_hook_error",
                f"the optimizer step listener {getattr(listener, '__qualname__', listener)}",
                exc,
                strict=strict,
                then="the optimizer step went on",
            )


def _register() -> None:
    global _registered, _waiting
    with _lock:
        _waiting = False
        if _registered:
            return
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(_dispatch_pre)
        register_optimizer_step_post_hook(_dispatch)
        _registered = True


def ensure_registered() -> None:
    """Register the dispatcher now if torch is imported, else right after torch's import.

    Call it where no optimizer hook can be running (a profile being built or started): torch's
    import never happens inside its own hook loop, so the deferred registration is safe too.
    """
    global _waiting
    with _lock:
        if _registered or _waiting:
            return
        _waiting = True
    import_watch.when_imported("torch", _register)


def add_listener(
    listener: OptimizerListener, *, strict: bool | None = None, before: bool = False
) -> None:
    """Call ``listener(optimizer)`` after every optimizer step, or before it with ``before``
    (safe inside a hook).

    A listener that raises is counted and logged on the ``collectors`` failure log (re-raised
    when ``strict``, ``None`` following ``config.strict``).  Without :func:`ensure_registered`
    having run earlier, the dispatcher is registered here, which is safe only outside torch's
    hook loop.
    """
    global _listeners, _pre_listeners
    with _lock:
        known = _pre_listeners if before else _listeners
        if all(entry != listener for entry, _ in known):  # bound methods: equal, not same
            if before:
                _pre_listeners = (*known, (listener, strict))
            else:
                _listeners = (*known, (listener, strict))
    ensure_registered()


def remove_listener(listener: OptimizerListener) -> None:
    """Stop calling ``listener`` (safe inside a hook; no error if it was not listening)."""
    global _listeners, _pre_listeners
    with _lock:
        _listeners = tuple(entry for entry in _listeners if entry[0] != listener)
        _pre_listeners = tuple(entry for entry in _pre_listeners if entry[0] != listener)


def listening() -> int:
    """How many listeners are registered, before and after the step (for tests)."""
    return len(_listeners) + len(_pre_listeners)
