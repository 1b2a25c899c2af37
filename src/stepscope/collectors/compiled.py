"""stepscope under ``torch.compile``: each instrument compiles as its torch counterpart does.

``record_function``: the block becomes torch's own ``record_function``.

Dynamo cannot trace the creation of stepscope's C ``RecordFunction`` (nor the clock reads of its
pure-Python twin), so a ``with stepscope.record_function(...)`` inside a compiled function would
make Dynamo give up on the whole frame.  Once the program imports ``torch._dynamo``, stepscope
registers a stand-in for the class's ``__new__`` that Dynamo uses while it traces: it returns
``torch.profiler.record_function(name, args)``, which Dynamo already handles (as torch does for
its own annotations).  Code that runs eagerly never sees the stand-in.

``profile``: Dynamo treats a ``torch.profiler.profile`` built inside a compiled function as a
``contextlib.nullcontext`` (it ignores the construction, ``__enter__`` and ``__exit__``, and warns
once), so the function compiles into the graphs it would give without the profiler.  Traced into,
``stepscope.profile``'s constructor calls torch's C extension, and Dynamo broke the graph there
and compiled every frame the profile then ran.  The same kind of stand-in for ``profile.__new__``
returns ``torch.profiler.profile()`` while Dynamo traces, so ours is ignored as torch's is; a
profile built eagerly is untouched.
"""

from __future__ import annotations

from typing import Any

from stepscope.collectors import import_watch

__all__ = ["register_profile_with_dynamo", "register_with_dynamo", "torch_args"]

_registered: set[int] = set()
_torch_profiler: Any = None
"""``torch.profiler``, once registered; a global (not a closure) so Dynamo resolves it."""


def torch_args(args: Any) -> str | None:
    """A ``record_function`` args value as torch's takes it (a string, or None)."""
    return None if args is None else args if isinstance(args, str) else str(args)


def _as_torch_record_function(cls: type, name: str, args: Any = None) -> Any:
    return _torch_profiler.record_function(name, torch_args(args))


def _register(classes: tuple[type, ...]) -> None:
    global _torch_profiler
    import torch.profiler
    from torch._dynamo import substitute_in_graph

    _torch_profiler = torch.profiler
    for cls in classes:
        new: Any = cls.__new__
        # object.__new__ is everyone's: only a class's own __new__ may be substituted.
        if id(cls) in _registered or new is object.__new__:
            continue
        substitute_in_graph(new, skip_signature_check=True)(_as_torch_record_function)
        _registered.add(id(cls))


def register_with_dynamo(*classes: type) -> None:
    """Make ``classes`` (record_function types) compile as torch's ``record_function``."""
    import_watch.when_imported("torch._dynamo", lambda: _register(classes))


def _as_torch_profile(cls: type, *args: Any, **kwargs: Any) -> Any:
    # torch's profile without arguments: Dynamo ignores every argument of torch's too
    return _torch_profiler.profile()


def _register_profile(cls: type) -> None:
    global _torch_profiler
    import torch.profiler
    from torch._dynamo import substitute_in_graph

    _torch_profiler = torch.profiler
    new: Any = cls.__new__
    if id(cls) in _registered or new is object.__new__:
        return
    substitute_in_graph(new, skip_signature_check=True)(_as_torch_profile)
    _registered.add(id(cls))


def register_profile_with_dynamo(cls: type) -> None:
    """Make ``cls`` (a profile type with a ``__new__`` of its own) compile as torch's
    ``profile``: ignored, as Dynamo ignores torch's."""
    import_watch.when_imported("torch._dynamo", lambda: _register_profile(cls))
