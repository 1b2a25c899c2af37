"""A user's program (a script or ``-m`` module) run as ``__main__``, as ``python`` would run it.

``stepscope run`` needs two things ``runpy`` does not give: tracebacks that start at the program
(no stepscope or runpy frames above it), and a way to act on the program's own functions when
they are defined.  For the latter the script's source is compiled with one extra call after
each top-level statement that binds a watched name (``def train``, ``class Trainer``, an
assignment or import of that name, also inside top-level ``if``/``try``/``with`` blocks); the
call hands the module's namespace to a callback.  Line numbers are untouched.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import runpy
import sys
import traceback
import types
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.trace.names import is_hidden

__all__ = ["Program", "find_program", "first_import", "print_program_traceback"]

BindHook = Callable[[dict[str, Any], str], None]
"""Called as ``hook(namespace, name)`` right after the program's top level binds ``name``."""

_HOOKS: dict[int, BindHook] = {}


@dataclass(frozen=True)
class Program:
    """What to run, and under which names."""

    display: str
    """The script path or module name, for messages."""
    argv: list[str]
    """``sys.argv`` as the program sees it."""
    module_name: str
    """The name the program's own module would be imported by (script stem, or ``-m`` name)."""
    path0: str
    """``sys.path[0]`` for the program (the script's directory, or the working directory)."""
    is_module: bool

    @contextmanager
    def as_main(self) -> Iterator[None]:
        """``sys.argv`` and ``sys.path[0]`` as ``python`` sets them for the program, then back."""
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        sys.argv = list(self.argv)
        sys.path.insert(0, self.path0)
        try:
            yield
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path

    def run(self, watch: Collection[str] = (), hook: BindHook | None = None) -> None:
        """Run the program as ``__main__`` (inside :meth:`as_main`); ``hook`` hears of top-level
        bindings of the names in ``watch``."""
        if not watch or hook is None:
            if self.is_module:
                runpy.run_module(self.module_name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(self.argv[0], run_name="__main__")
            return
        self._run_watched(watch, hook)

    def _run_watched(self, watch: Collection[str], hook: BindHook) -> None:
        filename, source, spec = self._source()
        tree = ast.parse(source, filename)
        key = id(hook)
        tree.body = _with_bind_calls(tree.body, watch, key)
        code = compile(ast.fix_missing_locations(tree), filename, "exec")
        module = types.ModuleType("__main__")
        module.__dict__.update(
            __file__=filename,
            __cached__=None,
            __builtins__=__builtins__,
            __spec__=spec,
            __package__=spec.parent if spec is not None else None,
            __loader__=spec.loader if spec is not None else None,
        )
        saved_main = sys.modules.get("__main__")
        sys.modules["__main__"] = module
        _HOOKS[key] = hook
        try:
            exec(code, module.__dict__)
        finally:
            _HOOKS.pop(key, None)
            if saved_main is not None:
                sys.modules["__main__"] = saved_main

    def _source(self) -> tuple[str, str, Any]:
        """(file name, source text, module spec or None) of the program."""
        if not self.is_module:
            return self.argv[0], Path(self.argv[0]).read_text(encoding="utf-8"), None
        spec = importlib.util.find_spec(self.module_name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{self.module_name}.__main__")
        loader = getattr(spec, "loader", None)
        source = loader.get_source(spec.name) if spec is not None and loader else None
        if spec is None or source is None or spec.origin is None:
            raise ValueError(
                f"cannot read the source of module {self.module_name!r} to hook its functions; "
                "pass --step-on for a function of another module"
            )
        return spec.origin, source, spec


MAX_SCANNED_FILES = 200
"""Source files :func:`first_import` reads at most (the program and its own modules)."""


def first_import(program: Program, wanted: Collection[str]) -> tuple[str, str] | None:
    """``(module, file)``: the first of ``wanted`` (top-level names) that the program's source,
    or the source of its own modules beside it, imports anywhere; None when none does.

    Only files under the program's directory (``sys.path[0]``) are followed, and at most
    :data:`MAX_SCANNED_FILES`; a file that cannot be read or parsed is skipped.
    """
    root = Path(program.path0).resolve()
    try:
        first = Path(program._source()[0]).resolve()
    except (OSError, ValueError, ImportError):
        return None
    queue, seen = [first], {first}
    while queue and len(seen) <= MAX_SCANNED_FILES:
        path = queue.pop(0)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, ValueError):
            continue
        for name, level in _imports(tree):
            top = name.split(".")[0]
            if level == 0 and top in wanted:
                return top, str(path)
            base = path.parent if level else root
            for _ in range(max(level - 1, 0)):
                base = base.parent
            for local in _local_files(base, name.split(".") if name else []):
                if local not in seen and local.is_relative_to(root):
                    seen.add(local)
                    queue.append(local)
    return None


def _imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(dotted name, relative level) of every import in the tree, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            yield module, node.level
            for alias in node.names:  # "from . import x" / "from pkg import sub"
                yield ".".join(filter(None, (module, alias.name))), node.level


def _local_files(base: Path, parts: list[str]) -> list[Path]:
    """The source files a dotted name resolves to under ``base`` (module and packages)."""
    found = []
    for depth in range(1, len(parts) + 1):
        target = base.joinpath(*parts[:depth])
        for candidate in (target.with_suffix(".py"), target / "__init__.py"):
            if candidate.is_file():
                found.append(candidate.resolve())
    return found


def find_program(module: str | None, rest: list[str]) -> Program:
    """The program named on the command line (``SCRIPT ARGS`` or ``-m MODULE ARGS``)."""
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if module:
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"no module named {module!r} (is it on PYTHONPATH?)")
        return Program(module, [module, *rest], module, os.getcwd(), True)
    if not rest:
        raise ValueError("nothing to run: pass SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    script = Path(rest[0])
    if not script.is_file():
        raise ValueError(f"script not found: {script}")
    return Program(
        str(script), [str(script), *rest[1:]], script.stem, str(script.resolve().parent), False
    )


def _bind(namespace: dict[str, Any], name: str, key: int) -> None:
    """Called by the program's rewritten top level (see the module docstring)."""
    hook = _HOOKS.get(key)
    if hook is not None:
        hook(namespace, name)


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _bind_call(name: str, key: int, at: ast.stmt) -> ast.stmt:
    call = ast.parse(
        f"__import__('stepscope.program').program._bind(globals(), {name!r}, {key})"
    ).body[0]
    return ast.copy_location(call, at)


def _with_bind_calls(body: list[ast.stmt], watch: Collection[str], key: int) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(node, (ast.If, ast.Try, ast.With)) and isinstance(inner, list) and inner:
                setattr(node, field, _with_bind_calls(inner, watch, key))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                handler.body = _with_bind_calls(handler.body, watch, key)
        out.append(node)
        out += [_bind_call(name, key, node) for name in sorted(_bound_names(node) & set(watch))]
    return out


def _launcher_frame(tb: types.TracebackType) -> bool:
    file = tb.tb_frame.f_code.co_filename
    return is_hidden(file)


def print_program_traceback(exc: BaseException) -> None:
    """Print the program's exception as ``python`` would: no launcher frames above the program."""
    tb = exc.__traceback__
    while tb is not None and _launcher_frame(tb):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)
