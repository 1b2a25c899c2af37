"""Process-wide settings of stepscope, with defaults read from the environment at import.

Assigning a field takes effect at once (modules that cache derived state subscribe with
``on_change``); ``config.patch(...)`` changes fields for the duration of a ``with`` block.

Environment variables:

- ``STEPSCOPE_METRIC_TABLES``: comma-separated metric tables to enable (see ``stepscope.tables``).
- ``STEPSCOPE_TABLES_DIR``: directory the ``metric_table_<name>.csv`` files are written to.
- ``STEPSCOPE_RUN_NAME``: the run / benchmark name written as each table row's first column.
- ``STEPSCOPE_SAVE_WAIT_S``: seconds a profile's stop, the exit or a SIGTERM waits for windows
  still being saved off the loop (default 60).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Config", "config"]

ENV_METRIC_TABLES = "STEPSCOPE_METRIC_TABLES"
ENV_TABLES_DIR = "STEPSCOPE_TABLES_DIR"
ENV_RUN_NAME = "STEPSCOPE_RUN_NAME"
ENV_SAVE_WAIT_S = "STEPSCOPE_SAVE_WAIT_S"
DEFAULT_SAVE_WAIT_S = 60.0

_TYPES: dict[str, tuple[type, ...]] = {
    "metric_tables": (str,),
    "tables_dir": (str, os.PathLike),
    "run_name": (str, type(None)),
    "strict": (bool,),
    "save_wait_s": (int, float),
}


def _env_metric_tables() -> str:
    return os.environ.get(ENV_METRIC_TABLES, "")


def _env_tables_dir() -> str:
    return os.environ.get(ENV_TABLES_DIR, ".")


def _env_run_name() -> str | None:
    return os.environ.get(ENV_RUN_NAME) or None


def _env_save_wait_s() -> float:
    text = os.environ.get(ENV_SAVE_WAIT_S, "")
    try:
        value = float(text) if text else DEFAULT_SAVE_WAIT_S
    except ValueError:
        return DEFAULT_SAVE_WAIT_S  # a bad value must not stop the program's import
    return value if value >= 0 else DEFAULT_SAVE_WAIT_S


@dataclass
class Config:
    """Typed settings; every assignment is checked and announced to subscribers."""

    metric_tables: str = field(default_factory=_env_metric_tables)
    """Comma-separated names of the metric tables to write (empty: none)."""
    tables_dir: str | os.PathLike[str] = field(default_factory=_env_tables_dir)
    """Directory for ``metric_table_<name>.csv`` files (created on first write)."""
    run_name: str | None = field(default_factory=_env_run_name)
    """Run / benchmark name for the first column of table rows (None: empty)."""
    strict: bool = False
    """Re-raise failures inside instruments instead of counting and logging them (for tests)."""
    save_wait_s: float = field(default_factory=_env_save_wait_s)
    """Seconds a profile's stop, the interpreter's exit or a SIGTERM waits for the windows still
    being saved off the training loop (each one not saved by then is named on stderr)."""
    _listeners: list[Callable[[str], None]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            self._check(f.name, getattr(self, f.name))

    @staticmethod
    def _check(name: str, value: Any) -> None:
        allowed = _TYPES.get(name)
        if allowed is not None and not isinstance(value, allowed):
            kinds = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise TypeError(f"config.{name} must be {kinds}, got {type(value).__name__}: {value!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_listeners":
            object.__setattr__(self, name, value)
            return
        if name not in _TYPES:
            known = ", ".join(_TYPES)
            raise AttributeError(f"stepscope config has no setting {name!r}; settings: {known}")
        self._check(name, value)
        old = self.__dict__.get(name, value)
        object.__setattr__(self, name, value)
        if self.__dict__.get("_listeners") and old != value:
            try:
                for listener in list(self._listeners):
                    listener(name)
            except BaseException:
                object.__setattr__(self, name, old)  # a rejected value does not stick
                raise

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(field_name)`` after each change; it may raise to reject the value."""
        self._listeners.append(listener)

    def reload_from_env(self) -> None:
        """Re-read every setting from the environment variables."""
        self.metric_tables = _env_metric_tables()
        self.tables_dir = _env_tables_dir()
        self.run_name = _env_run_name()
        self.save_wait_s = _env_save_wait_s()

    @contextlib.contextmanager
    def patch(self, **changes: Any) -> Iterator[Config]:
        """Set fields for the duration of a ``with`` block, then restore them."""
        saved = {name: getattr(self, name) for name in changes if name in _TYPES}
        applied: list[str] = []
        try:
            for name, value in changes.items():
                setattr(self, name, value)
                applied.append(name)
            yield self
        finally:
            for name in reversed(applied):
                setattr(self, name, saved[name])


config = Config()
"""The process-wide settings."""
