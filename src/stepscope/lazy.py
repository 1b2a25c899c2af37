"""A package's public names imported from their defining modules on first use (PEP 562).

A package ``__init__`` that imports every submodule makes each ``import pkg.sub`` pay for all of
them: ``stepscope report`` would load the whole profiler to reach one protocol module.  With
``__getattr__, __dir__ = lazy_names(globals(), {...})`` a name's module loads when the name is
first read, and the name is then kept as a plain global.  A name that is also a submodule's
(``profiler.profile``, the class, in ``profiler/profile.py``) stays the public object when the
submodule is imported, as it was when the package imported every name itself.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from stepscope.extras import MissingExtraError, unavailable_class

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], where: Mapping[str, str], stand_in_for_missing_extra: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for the names in ``where`` (name → module).

    With ``stand_in_for_missing_extra``, a class whose module needs an extra that is not
    installed reads as a stand-in whose construction raises the :class:`MissingExtraError`.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(module), name)
        except MissingExtraError as exc:
            if not stand_in_for_missing_extra:
                raise
            return unavailable_class(name, exc)  # not kept: an install may fix it later
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    class LazyPackage(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if name in where and isinstance(value, types.ModuleType):
                return  # the import system binding a submodule over a public name
            super().__setattr__(name, value)

    sys.modules[package].__class__ = LazyPackage
    return __getattr__, __dir__
