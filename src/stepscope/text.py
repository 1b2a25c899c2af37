"""Text that is always valid UTF-8: unpaired surrogates become U+FFFD."""

from __future__ import annotations

import re

__all__ = ["clean_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each unpaired surrogate (not encodable as UTF-8) replaced by one U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text
