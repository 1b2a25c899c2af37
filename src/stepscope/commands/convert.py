"""Convert a trace file: Chrome JSON, stepscope's compact form (.sstrace) or Perfetto protobuf.

FILE is a trace stepscope reads (Chrome JSON, .json.gz, or the compact .sstrace); --to chooses
what to write: ``chrome`` (JSON that HTA, TensorBoard and chrome://tracing read; gzip when the
output ends in .gz), ``compact`` (a tenth of the JSON's size or less, read by every stepscope
command) or ``perfetto`` (TrackEvent protobuf for ui.perfetto.dev; needs the perfetto extra).
The output defaults to FILE with the format's suffix.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.commands.command import Command

__all__ = ["COMMAND", "add_arguments", "default_output", "run"]

_FORMATS = ("chrome", "compact", "perfetto")
_KNOWN_SUFFIXES = (".json.gz", ".json", ".sstrace", ".pftrace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope convert``."""
    parser.add_argument("path", metavar="FILE", help="trace file to convert")
    parser.add_argument("--to", required=True, choices=_FORMATS, help="format to write")
    parser.add_argument("-o", "--output", metavar="OUT", help="output file (default: FILE's name)")


def default_output(path: Path, fmt: str) -> Path:
    """``path`` with its trace suffix replaced by the format's."""
    from stepscope.trace.formats import SUFFIXES

    name = path.name
    for suffix in _KNOWN_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(name + SUFFIXES[fmt])


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope convert``."""
    from stepscope.trace.formats import write_trace
    from stepscope.trace.loading import read_trace_file

    source = Path(args.path)
    if not source.is_file():
        raise ValueError(f"{source}: no such trace file")
    output = Path(args.output) if args.output else default_output(source, args.to)
    if output.resolve() == source.resolve():
        raise ValueError(f"{output}: the output would overwrite the input; pass -o OUT")
    trace = read_trace_file(source)
    stats = write_trace(trace, output, args.to)
    print(
        f"stepscope convert: {source} -> {stats.path} ({args.to}, {stats.bytes_written:,} bytes)",
        file=sys.stderr,
    )
    return 0


COMMAND = Command("convert", __doc__ or "", add_arguments, run)
"""``stepscope convert``."""
