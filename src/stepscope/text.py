"""Text that is always valid UTF-8 (unpaired surrogates become U+FFFD) and safe for a terminal."""

from __future__ import annotations

import re

__all__ = ["clean_text", "one_line", "printable", "valid_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each unpaired surrogate (not encodable as UTF-8) replaced by one U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def valid_text(text: str) -> tuple[str, int]:
    """``text`` as :func:`clean_text` gives it, and how many characters were replaced."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.subn("\ufffd", text)
    return text, 0


# C0 and C1 controls (tab and newline kept) and the bidirectional overrides and isolates, which
# can reorder what a reader sees ("Trojan source")
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe for a terminal: controls shown as ``\\xNN``, surrogates as U+FFFD."""
    return _UNPRINTABLE.sub(_escape, clean_text(text))


def one_line(text: str) -> str:
    """:func:`printable` with newlines and tabs escaped too: a message that stays on one line."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")
