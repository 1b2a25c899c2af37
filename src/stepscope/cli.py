"""The ``stepscope`` command line: one subcommand per job, each defined in its own module."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from stepscope._version import __version__
from stepscope.commands import attach, convert, diff, fleet, kernels, merge, report, run
from stepscope.commands.command import Command
from stepscope.extras import MissingExtraError
from stepscope.text import one_line
from stepscope.trace.names import hide_launcher

COMMANDS: tuple[Command, ...] = (
    run.COMMAND,
    kernels.COMMAND,
    report.COMMAND,
    diff.COMMAND,
    merge.COMMAND,
    convert.COMMAND,
    attach.COMMAND,
    fleet.COMMAND,
)
"""Every subcommand, in the order ``stepscope --help`` lists them."""


def plain_text(doc: str) -> str:
    """A docstring as terminal text: reST literals and roles (``:func:`x```) unmarked."""
    text = re.sub(r":\w+:`([^`]*)`", r"\1", doc)
    return text.replace("``", "'")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="stepscope", description="Step-aware performance observability."
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        doc = plain_text(command.doc).strip()
        lines = doc.splitlines()
        p = sub.add_parser(
            command.name,
            help=lines[0] if lines else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    if argv is None and sys.argv and sys.argv[0]:
        hide_launcher(sys.argv[0])  # the console script's frames are not the user's
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "_command", None)
    if command is None:
        parser.print_help()
        return 2
    try:
        return command.run(args)
    except (ValueError, OSError, MissingExtraError) as exc:  # bad input, a missing extra
        print(f"stepscope {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one line, no traceback
        if os.environ.get("STEPSCOPE_DEBUG"):
            raise
        print(
            f"stepscope {args.command}: internal error: {type(exc).__name__}: "
            f"{one_line(str(exc))[:500]} (STEPSCOPE_DEBUG=1 shows where; please report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
