"""Text that is always valid UTF-8: unpaired surrogates become U+FFFD."""

from __future__ import annotations

__all__ = ["clean_text"]


def clean_text(text: str) -> str:
    """``text`` with unpaired surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text
