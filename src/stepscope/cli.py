"""The ``stepscope`` command line: one subcommand per job, each defined in its own module."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from stepscope import __version__
from stepscope.extras import MissingExtraError
from stepscope.trace.names import hide_launcher

# subcommand -> module defining ``add_arguments(parser)`` and ``run(args) -> int``
SUBCOMMANDS: dict[str, str] = {
    "run": "stepscope.commands.run",
    "kernels": "stepscope.commands.kernels",
    "report": "stepscope.commands.report",
    "diff": "stepscope.commands.diff",
    "merge": "stepscope.commands.merge",
    "fleet": "stepscope.commands.fleet",
}


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
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        doc = plain_text(module.__doc__ or "").strip()
        lines = doc.splitlines()
        p = sub.add_parser(
            name,
            help=lines[0] if lines else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    if argv is None and sys.argv and sys.argv[0]:
        hide_launcher(sys.argv[0])  # the console script's frames are not the user's
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args))
    except (ValueError, OSError, MissingExtraError) as exc:  # bad input, missing extra: one line
        print(f"stepscope {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
