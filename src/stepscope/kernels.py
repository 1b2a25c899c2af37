"""Metadata of Triton kernels as torch.compile (inductor) writes them, read from source text.

Nothing is imported or executed: the kernel function (the one decorated with ``@triton.jit``,
preferring the one that also carries ``@triton_heuristics.<category>(...)``) is cut out of the
module text and parsed with ``ast``, so modules that would not import here (no GPU, no triton,
even a module with a syntax error elsewhere) still give their kernel's numbers.

Both generations of inductor output are understood: ``size_hints=[1024, 32]`` and
``size_hints={'x': 1024, 'r0_': 32}``, ``rnumel = 2048`` and ``r0_numel = 2048``.
``iter_kernel_sources`` also finds the kernels embedded in a wrapper module
(``async_compile.triton('name', '''...''')``).
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from stepscope.tables import Cell, get_metric_table

__all__ = [
    "CATEGORIES",
    "KernelMetadata",
    "KernelSource",
    "extract_kernel",
    "iter_kernel_sources",
    "kernel_category",
    "log_kernel_metadata",
    "parse_kernel_metadata",
]

CATEGORIES = (
    "pointwise",
    "reduction",
    "persistent_reduction",
    "cooperative_reduction",
    "split_scan",
    "foreach",
    "template",
    "fixed_config",
    "user_autotune",
)
"""``@triton_heuristics.<name>`` decorators recognised; any other kernel is ``unknown``."""

_NEEDS_SIZE_HINTS = frozenset(
    {"pointwise", "reduction", "persistent_reduction", "cooperative_reduction", "split_scan"}
)
_HAS_REDUCTION_HINT = frozenset({"reduction", "persistent_reduction", "cooperative_reduction"})

_JIT_LINE = re.compile(r"^@triton\.jit\b", re.MULTILINE)
_HEURISTICS = "@triton_heuristics."
_EMBEDDED = re.compile(
    r"""async_compile\.triton\(\s*(?P<q1>['"])(?P<name>\w+)(?P=q1)\s*,\s*"""
    r"""(?P<q2>'''|\"\"\")(?P<code>.*?)(?P=q2)""",
    re.DOTALL,
)
_KERNEL_PATH_COMMENT = re.compile(r"^# kernel path: (?P<path>.+)$", re.MULTILINE)
_NUM_GB_TEXT = re.compile(r"""['"]kernel_num_gb['"]\s*:\s*([0-9.eE+-]+)""")


@dataclass(frozen=True)
class KernelSource:
    """The kernel function cut out of a module: with its decorators and without them."""

    name: str
    fn_code: str
    """Decorators plus the function (what ``inspect.getsource`` would return)."""
    proper_code: str
    """From the ``def`` line to the end of the function."""
    first_line: int
    """1-based line of the first decorator in the module."""


@dataclass(frozen=True)
class KernelMetadata:
    """The ``kernel_metadata`` table's numbers for one kernel."""

    kernel_name: str
    kernel_category: str
    size_hints: str | None
    reduction_hint: str | None
    line_of_code: int
    num_load: int
    num_store: int
    num_for_loop: int
    num_atomic_add: int
    num_args: int
    xnumel: int | None
    ynumel: int | None
    rnumel: int | None
    kernel_args_num_gb: float | None

    def as_row(self, kernel_path: str, kernel_name: str | None = None) -> dict[str, Cell]:
        """The ``kernel_metadata`` row (``kernel_name`` overrides the function's name)."""
        row: dict[str, Cell] = asdict(self)
        row["kernel_path"] = kernel_path
        if kernel_name is not None:
            row["kernel_name"] = kernel_name
        return row


def _decorator_start(lines: list[str], jit_index: int) -> int:
    """Index of the first line of the decorator block that ends with ``@triton.jit``."""
    start = jit_index
    k = jit_index - 1
    while k >= 0:
        line = lines[k]
        if not line.rstrip("\r"):  # an empty line ends the block; inside a call lines are indented
            break
        if line.startswith("@"):
            start = k
        elif not (line[0].isspace() or line.startswith((")", "]", "}"))):
            break
        k -= 1
    return start


def _function_end(lines: list[str], def_index: int) -> int:
    """Index one past the last non-blank line of the function starting at ``def_index``."""
    end = def_index + 1
    k = def_index + 1
    while k < len(lines):
        line = lines[k]
        if line.strip():
            if not line[0].isspace():
                break
            end = k + 1
        k += 1
    return end


def _def_index(lines: list[str], jit_index: int) -> int:
    for k in range(jit_index + 1, len(lines)):
        line = lines[k]
        if line.startswith("def "):
            return k
        if line.strip() and not line.startswith("@"):
            break
    raise ValueError(f"no 'def' follows the @triton.jit on line {jit_index + 1}")


def _candidates(code: str) -> list[tuple[int, int, int]]:
    """(decorator start, def line, end) of every ``@triton.jit`` function in ``code``."""
    lines = code.split("\n")
    found = []
    for match in _JIT_LINE.finditer(code):
        jit_index = code.count("\n", 0, match.start())
        def_index = _def_index(lines, jit_index)
        found.append(
            (_decorator_start(lines, jit_index), def_index, _function_end(lines, def_index))
        )
    return found


def extract_kernel(kernel_module_code: str) -> KernelSource:
    """Cut the kernel function out of a kernel module's source.

    With several ``@triton.jit`` functions the one decorated with ``@triton_heuristics`` is the
    kernel (the others are helpers); a ``ValueError`` says what was found otherwise.
    """
    if not isinstance(kernel_module_code, str):
        raise TypeError(f"kernel module code must be str, got {type(kernel_module_code).__name__}")
    lines = kernel_module_code.split("\n")
    found = _candidates(kernel_module_code)
    if not found:
        raise ValueError("kernel function not found: no '@triton.jit' decorator at column 0")
    with_heuristics = [
        c for c in found if any(line.startswith(_HEURISTICS) for line in lines[c[0] : c[1]])
    ]
    chosen = with_heuristics or found
    if len(chosen) != 1:
        names = [lines[d].split("(")[0].removeprefix("def ").strip() for _, d, _ in chosen]
        raise ValueError(
            f"kernel function is ambiguous: {len(chosen)} @triton.jit functions {names}"
            + (" carry @triton_heuristics" if with_heuristics else "")
            + "; pass the source of one kernel module"
        )
    start, def_index, end = chosen[0]
    name = lines[def_index].split("(")[0].removeprefix("def ").strip()
    return KernelSource(
        name=name,
        fn_code="\n".join(lines[start:end]) + "\n",
        proper_code="\n".join(lines[def_index:end]) + "\n",
        first_line=start + 1,
    )


def _parse_function(source: KernelSource) -> ast.FunctionDef:
    try:
        tree = ast.parse(source.fn_code)
    except SyntaxError as exc:
        line = (exc.lineno or 1) + source.first_line - 1
        raise ValueError(
            f"kernel function {source.name!r} is not valid Python (line {line}: {exc.msg})"
        ) from None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError(f"kernel function {source.name!r}: no function definition found")
    return fn


def _heuristics_call(fn: ast.FunctionDef) -> tuple[ast.Call | None, str]:
    """The ``@triton_heuristics.<name>(...)`` decorator and its category (or None, unknown)."""
    for dec in fn.decorator_list:
        if (
            isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Attribute)
            and isinstance(dec.func.value, ast.Name)
            and dec.func.value.id == "triton_heuristics"
        ):
            name = dec.func.attr
            return dec, name if name in CATEGORIES else "unknown"
    return None, "unknown"


def _keyword(call: ast.Call | None, name: str) -> ast.expr | None:
    if call is None:
        return None
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def kernel_category(kernel_module_code: str) -> str:
    """``pointwise``, ``reduction``, ... from the kernel's ``@triton_heuristics`` decorator."""
    return _heuristics_call(_parse_function(extract_kernel(kernel_module_code)))[1]


def _size_hints(source: KernelSource, call: ast.Call | None, category: str) -> str | None:
    node = _keyword(call, "size_hints")
    if node is None:
        if category in _NEEDS_SIZE_HINTS:
            raise ValueError(
                f"size_hints not found in the @triton_heuristics.{category}(...) decorator of "
                f"kernel {source.name!r}"
            )
        return None
    return ast.get_source_segment(source.fn_code, node)


def _reduction_hint(source: KernelSource, call: ast.Call | None, category: str) -> str | None:
    if category not in _HAS_REDUCTION_HINT:
        return None
    node = _keyword(call, "reduction_hint")
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ReductionHint"
    ):
        return node.attr
    raise ValueError(
        f"reduction_hint=ReductionHint.<NAME> not found in the @triton_heuristics.{category}(...) "
        f"decorator of kernel {source.name!r}"
    )


def _num_gb(source: KernelSource, call: ast.Call | None) -> float | None:
    meta = _keyword(call, "inductor_meta")
    if isinstance(meta, ast.Dict):
        for key, value in zip(meta.keys, meta.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "kernel_num_gb":
                return _as_gb(source, ast.get_source_segment(source.fn_code, value) or "")
        return None
    match = _NUM_GB_TEXT.search(source.fn_code)  # meta not written as a dict literal
    return _as_gb(source, match.group(1)) if match else None


def _meta_kernel_name(call: ast.Call | None) -> str | None:
    """``inductor_meta['kernel_name']`` (old modules name their function just ``triton_``)."""
    meta = _keyword(call, "inductor_meta")
    if not isinstance(meta, ast.Dict):
        return None
    for key, value in zip(meta.keys, meta.values, strict=True):
        named = isinstance(key, ast.Constant) and key.value == "kernel_name"
        if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return None


def _as_gb(source: KernelSource, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"kernel_num_gb of kernel {source.name!r} is not a number: {text!r}")
    return value


def _count_args(fn: ast.FunctionDef) -> int:
    a = fn.args
    return (
        len(a.posonlyargs)
        + len(a.args)
        + len(a.kwonlyargs)
        + (a.vararg is not None)
        + (a.kwarg is not None)
    )


def _code_only(code: str) -> str:
    """``code`` with its comments cut out (a comment saying "for each tile" is not a loop)."""
    lines = code.split("\n")
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, SyntaxError):
        return code  # already parsed by ast, so this does not happen; count the text as is
    return "\n".join(lines)


def _numel(proper_code: str, prefix: str) -> int | None:
    match = re.search(rf"(?<![\w.]){prefix}numel = (\d+)\b", proper_code)
    return int(match.group(1)) if match else None


def _rnumel(proper_code: str) -> int | None:
    flat = _numel(proper_code, "r")
    if flat is not None:
        return flat
    # Newer inductor writes static ``r0_numel = N`` (and ``rnumel = r0_numel [* r1_numel]``).
    dims: dict[str, int] = {}
    for match in re.finditer(r"(?<![\w.])r(\d+)_numel = (\d+)\b", proper_code):
        dims.setdefault(match.group(1), int(match.group(2)))
    return math.prod(dims.values()) if dims else None


def parse_kernel_metadata(kernel_module_code: str) -> KernelMetadata:
    """Every ``kernel_metadata`` field of the kernel in this module's source.

    A ``ValueError`` names the field that could not be found (size_hints, reduction_hint, the
    kernel function itself, kernel_num_gb when malformed).
    """
    source = extract_kernel(kernel_module_code)
    fn = _parse_function(source)
    call, category = _heuristics_call(fn)
    proper = source.proper_code
    code = _code_only(proper)
    return KernelMetadata(
        kernel_name=_meta_kernel_name(call) or source.name,
        kernel_category=category,
        size_hints=_size_hints(source, call, category),
        reduction_hint=_reduction_hint(source, call, category),
        line_of_code=proper.count("\n"),
        num_load=code.count("tl.load"),
        num_store=code.count("tl.store"),
        num_for_loop=code.count("for "),
        num_atomic_add=code.count("tl.atomic_add"),
        num_args=_count_args(fn),
        xnumel=_numel(code, "x"),
        ynumel=_numel(code, "y"),
        rnumel=_rnumel(code),
        kernel_args_num_gb=_num_gb(source, call),
    )


def log_kernel_metadata(kernel_name: str, kernel_path: str, kernel_module_code: str) -> None:
    """Add the kernel's row to the ``kernel_metadata`` table (parsed only when it is enabled)."""
    get_metric_table("kernel_metadata").add_row(
        lambda: parse_kernel_metadata(kernel_module_code).as_row(kernel_path, kernel_name)
    )


def iter_kernel_sources(text: str) -> Iterator[tuple[str | None, str, str | None]]:
    """``(kernel name, kernel module code, kernel path)`` for each Triton kernel in a file.

    A wrapper module yields its embedded ``async_compile.triton`` kernels (name from the call,
    path from the ``# kernel path:`` comment above it, or None); a kernel module yields itself
    (name None: take it from the parsed function).  Files with neither yield nothing.
    """
    embedded = list(_EMBEDDED.finditer(text))
    if embedded:
        previous_end = 0
        for match in embedded:
            paths = list(_KERNEL_PATH_COMMENT.finditer(text, previous_end, match.start()))
            path = paths[-1].group("path").strip() if paths else None
            previous_end = match.end()
            yield match.group("name"), match.group("code"), path
        return
    if _HEURISTICS in text and _JIT_LINE.search(text):
        yield None, text, None
