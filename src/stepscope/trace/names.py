"""How frames are named for people: labels for stacks, paths as py-spy shows them, and which
code is stepscope's own (never shown in a user's results)."""

from __future__ import annotations

import os
import sys

__all__ = ["STEPSCOPE_ROOT", "frame_label", "sample_frame_label", "short_path"]

STEPSCOPE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""stepscope's own package directory: its code is never recorded (it is not the user's)."""


def frame_label(name: str) -> str:
    """A frame name safe for the collapsed format (no ';', no line breaks)."""
    return " ".join(name.replace(";", ":").split()) or "?"


def short_path(file: str) -> str:
    """A source path without the longest ``sys.path`` entry it starts with (as py-spy shows it)."""
    best = ""
    for entry in sys.path:
        root = entry.rstrip(os.sep) + os.sep if entry else ""
        if root and file.startswith(root) and len(root) > len(best):
            best = root
    return file[len(best) :] if best else file


def sample_frame_label(name: str, file: str) -> str:
    """The collapsed-stack label of a sampled frame: ``function (path/module.py)``."""
    return frame_label(f"{name} ({short_path(file)})" if file else name)
