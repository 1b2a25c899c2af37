"""Flame graph SVG from collapsed stacks, in the layout of Brendan Gregg's flamegraph.pl.

No maintained Python package renders flame graph SVGs (flamegraph.pl is Perl, inferno is Rust),
so this is a small renderer: root at the bottom, children sorted by name, width proportional to
samples, a hover title per frame, frames narrower than ``min_width_px`` left out.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from stepscope.atomic import atomic_output
from stepscope.text import clean_text

__all__ = ["flamegraph_svg", "write_flamegraph"]

FONT_SIZE = 12
CHAR_WIDTH = FONT_SIZE * 0.59
PAD_TOP = 36
PAD_BOTTOM = 12
PAD_SIDE = 10


@dataclass
class _Node:
    total: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(stacks: Mapping[str, int]) -> _Node:
    root = _Node()
    for stack, value in stacks.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"collapsed stack {stack!r} has value {value!r}; expected an int >= 0")
        root.total += value
        node = root
        for name in stack.split(";"):
            node = node.children.setdefault(name, _Node())
            node.total += value
    return root


# characters XML 1.0 does not allow, even escaped
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml(text: str) -> str:
    """``text`` escaped for XML, with characters XML cannot hold replaced by U+FFFD."""
    return escape(_NOT_XML.sub("\ufffd", clean_text(text)))


def _color(name: str) -> str:
    """A stable warm colour per function name (flamegraph.pl's 'hot' palette)."""
    digest = hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=3).digest()
    return f"rgb({205 + digest[0] % 50},{digest[1] % 230},{digest[2] % 55})"


def flamegraph_svg(
    stacks: Mapping[str, int],
    *,
    title: str = "Flame graph",
    width: int = 1200,
    frame_height: int = 16,
    min_width_px: float = 0.1,
    unit: str = "samples",
) -> str:
    """The SVG text of a flame graph of ``stacks`` (``a;b;c`` -> count)."""
    if width < 100 or frame_height < 4:
        raise ValueError(f"width must be >= 100 and frame_height >= 4, got {width}, {frame_height}")
    root = _tree(stacks)
    scale = (width - 2 * PAD_SIDE) / root.total if root.total else 0.0
    rows: list[tuple[int, float, float, str, int]] = []  # depth, x, w, name, total

    def place(node: _Node, name: str, depth: int, x: float) -> int:
        w = node.total * scale
        if w < min_width_px:
            return depth
        rows.append((depth, x, w, name, node.total))
        deepest = depth
        for child_name in sorted(node.children):
            child = node.children[child_name]
            deepest = max(deepest, place(child, child_name, depth + 1, x))
            x += child.total * scale
        return deepest

    depth = place(root, "all", 0, PAD_SIDE) if root.total else 0
    height = PAD_TOP + (depth + 1) * frame_height + PAD_BOTTOM
    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="Verdana, sans-serif" '
        f'font-size="{FONT_SIZE}">\n',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8f8f8"/>\n',
        f'<text x="{width / 2:.1f}" y="24" text-anchor="middle" font-size="{FONT_SIZE + 5}">'
        f"{_xml(title)}</text>\n",
    ]
    for row_depth, x, w, name, total in rows:
        y = height - PAD_BOTTOM - (row_depth + 1) * frame_height
        share = 100.0 * total / root.total
        label = f"{name} ({total:,} {unit}, {share:.2f}%)"
        fits = int((w - 6) / CHAR_WIDTH)
        text = name if len(name) <= fits else (name[: fits - 2] + ".." if fits >= 3 else "")
        out.append(
            f"<g><title>{_xml(label)}</title>"
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{frame_height - 1}" '
            f'fill={quoteattr(_color(name))} rx="2" ry="2"/>'
        )
        if text:
            out.append(f'<text x="{x + 3:.2f}" y="{y + frame_height - 4}">{_xml(text)}</text>')
        out.append("</g>\n")
    out.append("</svg>\n")
    return "".join(out)


def write_flamegraph(
    stacks: Mapping[str, int], path: str | os.PathLike[str], *, title: str = "Flame graph"
) -> int:
    """Write a flame graph SVG of collapsed stacks atomically; returns the frames drawn."""
    svg = flamegraph_svg(stacks, title=title)
    with atomic_output(path, what="flame graph") as fh:
        fh.write(svg.encode("utf-8"))
    return svg.count("<g>")
