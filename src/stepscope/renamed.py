"""Options that were renamed: the new spelling, with the old one still accepted."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["renamed_option"]

T = TypeVar("T")


def renamed_option(new_name: str, new: T | None, old_name: str, old: T | None, default: T) -> T:
    """The value given under ``new_name`` or its old spelling ``old_name`` (not both), else
    ``default``."""
    if old is None:
        return default if new is None else new
    if new is not None:
        raise TypeError(f"pass {new_name}= or its old spelling {old_name}=, not both")
    return old
