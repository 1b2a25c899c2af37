"""An install without the C extension works on the pure-Python twins and says why.

A copy of the source tree is installed in editable mode into a fresh virtual environment with
``STEPSCOPE_NO_NATIVE_BUILD=1`` (what a machine without a compiler gets), offline: the
environment borrows this interpreter's setuptools, and this interpreter's pip installs into it
(``pip --python``).  Then ``import stepscope`` and a profile run there, with things that answer
to the extension's name and are not the built extension lying where it would be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.trace import read_chrome_trace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

PROGRAM = r"""
import json, sys
import stepscope
from stepscope import clock
from stepscope._ext import native

out = sys.argv[1]


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


with stepscope.profile(
    activities=[stepscope.ProfilerActivity.CPU, stepscope.ProfilerActivity.PYTHON],
    schedule=stepscope.schedule(wait=0, warmup=1, active=2, repeat=1),
    on_trace_ready=stepscope.trace_handler(out),
) as prof:
    for _ in range(3):
        with stepscope.record_function("work"):
            fib(12)
        prof.step()
table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
print(json.dumps({
    "native": native() is not None,
    "clock": clock.clock_info(),
    "table": table,
    "stepscope": stepscope.__file__,
}))
"""


def _pip_can_target_another_python() -> bool:
    version = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, check=False
    )
    if version.returncode != 0:
        return False
    major, minor = (int(p) for p in version.stdout.split()[1].split(".")[:2])
    return (major, minor) >= (22, 3)


def _setuptools_parts() -> list[Path]:
    """setuptools as installed for this interpreter (its packages, .pth and dist-info)."""
    spec = importlib.util.find_spec("setuptools")
    if spec is None or spec.origin is None:
        return []
    site = Path(spec.origin).parent.parent
    names = ["setuptools", "_distutils_hack", "distutils-precedence.pth", "pkg_resources"]
    parts = [site / n for n in names if (site / n).exists()]
    return parts + sorted(site.glob("setuptools-*.dist-info"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(python of a fresh environment, the source tree installed there without the extension)."""
    if not _pip_can_target_another_python():
        pytest.skip("needs pip >= 22.3 (pip --python)")
    parts = _setuptools_parts()
    if not parts:
        pytest.skip("setuptools is not installed for this interpreter")
    root = tmp_path_factory.mktemp("no-extension")
    tree = root / "tree"
    tree.mkdir()
    shutil.copytree(
        REPO / "src",
        tree / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info"),
    )
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    venv = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for part in parts:
        (Path(purelib) / part.name).symlink_to(part)
    env = _clean_env()
    env["STEPSCOPE_NO_NATIVE_BUILD"] = "1"
    install = subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "--disable-pip-version-check", "--python", str(python)),
            *("install", "-q", "--no-deps", "--no-build-isolation", "--no-index"),
            *("-e", str(tree)),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    return python, tree


def _clean_env() -> dict[str, str]:
    """This environment minus what would lead the child to another stepscope or the twins."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "STEPSCOPE_IMPLEMENTATION")
        and not k.startswith("PIP_")
    }


def _run(python: Path, out: Path) -> dict[str, object]:
    done = subprocess.run(
        [str(python), "-c", PROGRAM, str(out)],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=out.parent,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _check_profile(result: dict[str, object], out: Path, tree: Path) -> str:
    """The run used the twins from the installed tree and wrote a trace; the reason given."""
    assert result["native"] is False
    assert str(result["stepscope"]).startswith(str(tree / "src" / "stepscope"))
    table = str(result["table"])
    assert "work" in table and "fib" in table  # annotations and the Python tracer's twin
    clock_info = result["clock"]
    assert isinstance(clock_info, dict) and clock_info["source"] == "python_monotonic"
    traces = sorted(out.glob("*.pt.trace.json"))
    assert len(traces) == 1
    trace = read_chrome_trace(traces[0])
    assert trace.metadata["stepscope_clock"]["extension"] == clock_info["extension"]
    names = {trace.strings[n] for n in trace.spans["name"]}
    assert "work" in names and "ProfilerStep#1" in names
    extension = clock_info["extension"]
    assert isinstance(extension, dict) and extension["native"] is False
    return str(extension["reason"])


def test_an_install_without_the_extension_imports_and_profiles(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    python, tree = installed
    assert not (tree / "src" / "stepscope" / "_native").exists()
    reason = _check_profile(_run(python, tmp_path / "out"), tmp_path / "out", tree)
    assert reason.startswith("stepscope._native is not built")


def test_a_folder_named_like_the_extension_is_not_taken_for_it(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    # What an older checkout leaves behind: the C sources' old folder, no extension.
    python, tree = installed
    leftover = tree / "src" / "stepscope" / "_native"
    leftover.mkdir()
    (leftover / "clock.c").write_text("/* left over */\n")
    try:
        reason = _check_profile(_run(python, tmp_path / "out"), tmp_path / "out", tree)
    finally:
        shutil.rmtree(leftover)
    assert f"{leftover} is a folder (namespace package), not the extension module" in reason


def test_a_python_module_named_like_the_extension_is_refused(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    python, tree = installed
    impostor = tree / "src" / "stepscope" / "_native.py"
    impostor.write_text("now_ns = None\n")
    try:
        reason = _check_profile(_run(python, tmp_path / "out"), tmp_path / "out", tree)
    finally:
        impostor.unlink()
    assert f"{impostor} is a module loaded by SourceFileLoader" in reason


def test_clock_info_says_which_implementation_runs_and_why() -> None:
    from stepscope import _ext, clock

    extension = clock.clock_info()["extension"]
    assert isinstance(extension, dict)
    if os.environ.get("STEPSCOPE_IMPLEMENTATION") == "python":
        assert extension == {
            "native": False,
            "reason": "disabled by STEPSCOPE_IMPLEMENTATION=python",
        }
    elif _ext.native() is None:
        assert extension == {"native": False, "reason": _ext.load_error}
    else:
        assert extension["native"] is True
        assert str(extension["file"]).startswith("_native.")
