"""The one shape of a subcommand: its name, its help, how it reads its arguments, how it runs.

``stepscope`` builds every command's arguments before it runs one, so a command module imports
at its top what its arguments need and imports the machinery of its work (the profiler, say)
when it runs: ``stepscope report`` never loads the profiler, nor ``stepscope run`` the readers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """A ``stepscope`` subcommand (each module under ``commands/`` defines one ``COMMAND``)."""

    name: str
    doc: str
    """The module's docstring: the first line is the short help, the whole is the description."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    """Runs the command; returns the exit status (a ``ValueError``/``OSError`` is a one-line
    error with exit status 1)."""
