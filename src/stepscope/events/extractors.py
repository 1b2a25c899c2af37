"""Attributes from a call's arguments: ``fields=`` specs, argument binding, checkpoint fields.

A ``fields=`` spec is one of, or a list of:

- a mapping ``{"attr": source}`` where ``source`` is an argument name (``"checkpoint_id"``) or a
  callable taking the call's arguments (a mapping of name to value) and returning the value;
- a callable taking the call's arguments and returning a mapping of several attributes
  (like :func:`checkpoint_fields`).

The arguments mapping holds the arguments passed (positional ones under their parameter names,
keyword ones as given), the function's defaults for the others, and the decorator's static
values, which also stand in for arguments left at their default.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stepscope.events.coerce import AttrSet
from stepscope.events.failures import report_failure

__all__ = ["Binder", "Extractor", "bind_static", "checkpoint_fields", "make_binder", "parse_fields"]

Arguments = Mapping[str, Any]
Binder = Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]


class Extractor:
    """One normalised piece of a ``fields=`` spec."""

    __slots__ = ("arg", "fn", "label", "name")

    def __init__(
        self, name: str | None, fn: Callable[[Arguments], Any] | None, arg: str | None, label: str
    ) -> None:
        self.name = name
        """The attribute it fills, or None when ``fn`` returns a mapping of attributes."""
        self.fn = fn
        self.arg = arg
        """The argument it copies, when given by name."""
        self.label = label

    def run(self, arguments: Arguments, attrs: AttrSet) -> None:
        """Add this extractor's attributes; a failure is counted as a dropped attribute."""
        try:
            if self.arg is not None:
                if self.arg in arguments:
                    attrs.add(self.name or self.arg, arguments[self.arg])
                return
            fn = self.fn
            if fn is None:
                return
            value = fn(arguments)
            if self.name is not None:
                attrs.add(self.name, value)
                return
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"a fields extractor must return a mapping of attributes, got "
                    f"{type(value).__name__}"
                )
            for key, item in value.items():
                attrs.add(key if isinstance(key, str) else str(key), item)
        except Exception as exc:
            attrs.dropped += 1
            report_failure("extractor_error", self.label, exc)


def _label(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def parse_fields(fields: Any) -> tuple[Extractor, ...]:
    """Normalise a ``fields=`` spec (see the module docstring); TypeError on anything else."""
    if fields is None:
        return ()
    if isinstance(fields, Mapping):
        out = []
        for name, source in fields.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"fields names must be non-empty strings, got {name!r}")
            if isinstance(source, str):
                out.append(Extractor(name, None, source, f"fields[{name!r}]"))
            elif callable(source):
                out.append(Extractor(name, source, None, f"fields[{name!r}] ({_label(source)})"))
            else:
                raise TypeError(
                    f"fields[{name!r}] must be an argument name or a callable taking the "
                    f"call's arguments, got {type(source).__name__}"
                )
        return tuple(out)
    if callable(fields):
        return (Extractor(None, fields, None, _label(fields)),)
    if isinstance(fields, Sequence) and not isinstance(fields, (str, bytes)):
        return tuple(e for part in fields for e in parse_fields(part))
    raise TypeError(
        "fields must be a mapping {attr: argument name or callable}, a callable returning a "
        f"mapping of attributes, or a list of those; got {type(fields).__name__}"
    )


def make_binder(fn: Callable[..., Any], static: Mapping[str, Any]) -> tuple[Binder, set[str]]:
    """A fast ``(args, kwargs) -> arguments`` for ``fn``, and the names it can always resolve."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature (some builtins): keywords only
        base_only = dict(static)
        return lambda args, kwargs: {**base_only, **kwargs}, set(static)
    kinds = inspect.Parameter
    positional = [
        p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    var_pos = next((p.name for p in params if p.kind is kinds.VAR_POSITIONAL), None)
    open_keywords = any(p.kind is kinds.VAR_KEYWORD for p in params)
    defaults: dict[str, Any] = {
        p.name: p.default
        for p in params
        if p.default is not p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
    }
    base = dict(defaults)
    if var_pos is not None:
        base[var_pos] = ()
    base.update(static)
    # a static value stands in for an argument left at its default (the same object)
    fill = [(name, defaults[name], static[name]) for name in static if name in defaults]
    n = len(positional)
    known = {p.name for p in params if p.kind is not kinds.VAR_KEYWORD} | set(static)
    if open_keywords:
        known.add("*")

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        out = base.copy()
        out.update(zip(positional, args, strict=False))
        if var_pos is not None and len(args) > n:
            out[var_pos] = args[n:]
        if kwargs:
            out.update(kwargs)
        for name, default, value in fill:
            if out[name] is default:
                out[name] = value
        return out

    return bind, known


def bind_static(static: Mapping[str, Any]) -> Binder:
    """The binder of a context-manager use: the static values are the arguments."""
    frozen = dict(static)
    return lambda args, kwargs: frozen.copy()


def checkpoint_fields(arguments: Arguments) -> dict[str, Any]:
    """torch.distributed.checkpoint's fields: ``checkpoint_id`` and writer/reader/planner classes.

    ``checkpoint_id`` is the argument, or else the ``checkpoint_id`` of ``storage_writer`` (or
    ``storage_reader``), as a string (None when neither has one); ``storage_writer``,
    ``storage_reader`` and ``planner`` are the class names of those arguments when given.
    """
    writer = arguments.get("storage_writer")
    reader = arguments.get("storage_reader")
    planner = arguments.get("planner")
    checkpoint_id = arguments.get("checkpoint_id")
    serializer = writer or reader
    if not checkpoint_id and serializer:
        checkpoint_id = getattr(serializer, "checkpoint_id", None)
    out: dict[str, Any] = {"checkpoint_id": None if checkpoint_id is None else str(checkpoint_id)}
    if writer:
        out["storage_writer"] = writer.__class__.__name__
    if reader:
        out["storage_reader"] = reader.__class__.__name__
    if planner:
        out["planner"] = planner.__class__.__name__
    return out
