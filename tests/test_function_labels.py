"""Function names in report tables are whole: a long label is shortened at a path separator from
the left (``name (…/pkg/mod.py)``), never cut mid-name (issue 36, item 7: ``stepscope attach
--sample`` showed ``a_function (deep/pkg_with_a_long_name/subpacka``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope.report.labels import fit_function_label, fit_label
from tests.attach_helpers import ROOT, attach, child_env

LONG = "a_function_with_a_rather_long_name"
PACKAGE = ("pkg_with_a_long_name", "subpackage_also_long", "module_with_long_name.py")


@pytest.mark.parametrize(
    ("label", "width", "expected"),
    [
        (f"{LONG} (deep/{'/'.join(PACKAGE)})", 90, f"{LONG} (…/{PACKAGE[1]}/{PACKAGE[2]})"),
        (f"{LONG} (deep/{'/'.join(PACKAGE)})", 70, f"{LONG} (…/{PACKAGE[2]})"),
        (f"{LONG} (deep/{'/'.join(PACKAGE)})", 55, f"{LONG} (…/{PACKAGE[2]})"),
        (
            "forward (/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py)",
            55,
            "forward (…/site-packages/torch/nn/modules/linear.py)",
        ),
        (
            "torch/nn/modules/module.py(1501): _call_impl_of_a_module_with_a_long_name",
            60,
            "…/module.py(1501): _call_impl_of_a_module_with_a_long_name",
        ),
        # no separator to shorten at: whole, longer than asked
        (
            "SourceLoader.source_to_code (<frozen importlib._bootstrap_external>)",
            55,
            "SourceLoader.source_to_code (<frozen importlib._bootstrap_external>)",
        ),
        ("short (a.py)", 20, "short (a.py)"),
    ],
)
def test_a_function_label_keeps_its_name_and_file_whole(
    label: str, width: int, expected: str
) -> None:
    assert fit_label(label, width) == expected


def test_a_long_path_is_cut_at_separators_only() -> None:
    path = "/".join(f"component{i:02d}" for i in range(12)) + "/leaf_module.py"
    for width in range(20, 140, 7):
        got = fit_label(f"f ({path})", width)
        assert got == f"f ({path})" or len(got) <= max(width, len("f (…/leaf_module.py)")), got
        tail = got[len("f (") : -1].removeprefix("…/")
        assert path.endswith("/" + tail) or path == tail, got  # whole components


def test_other_names_are_cut_as_before() -> None:
    op = "aten::an_operator_whose_name_goes_on_and_on_and_on_and_on"
    assert fit_function_label(op, 30) is None
    assert fit_label(op, 30) == op[:29] + "…"


def _deep_module(root: Path) -> Path:
    """A module at root/pkg_with_a_long_name/subpackage_also_long/module_with_long_name.py with
    a function that spins."""
    directory = root.joinpath(*PACKAGE[:-1])
    directory.mkdir(parents=True)
    for level in range(1, len(PACKAGE)):
        root.joinpath(*PACKAGE[:level], "__init__.py").write_text("")
    module = directory / PACKAGE[-1]
    module.write_text(
        f"def {LONG}(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n"
        "    return total\n"
    )
    return module


def test_attach_sample_report_shows_whole_function_names(tmp_path: Path) -> None:
    _deep_module(tmp_path / "deep")
    script = tmp_path / "target.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path / 'deep')!r})\n"
        f"from {'.'.join(PACKAGE[:-1])}.{PACKAGE[-1][:-3]} import {LONG}\n"
        f"print('ready', flush=True)\nwhile True:\n    {LONG}(10000)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=child_env(tmp_path)
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        sampled = attach(str(proc.pid), "--sample", "1", "-o", str(tmp_path / "out"))
    finally:
        proc.kill()
        proc.communicate()
    if sampled.returncode != 0 and "py-spy" in sampled.stderr:
        pytest.skip(f"py-spy cannot sample here: {sampled.stderr.strip()}")
    assert sampled.returncode == 0, sampled.stderr
    path = sampled.stdout.strip().rsplit(": ", 1)[1]
    report = subprocess.run(
        [sys.executable, "-m", "stepscope", "report", path],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # py-spy's full file names are shown from the working directory
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"},
    )
    assert report.returncode == 0, report.stderr
    rows = [line for line in report.stdout.splitlines() if LONG in line]
    assert rows, report.stdout
    assert f"{LONG} (…/{PACKAGE[-1]})" in rows[0], rows[0]  # 70 characters: the file's name


def test_the_profile_table_keeps_function_labels_whole(tmp_path: Path) -> None:
    _deep_module(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(f"{'.'.join(PACKAGE[:-1])}.{PACKAGE[-1][:-3]}", fromlist=[LONG])
        with stepscope.profile(
            activities=["CPU", "SAMPLING"], torch_ops=False, sampling_rate_hz=500
        ) as prof:
            getattr(module, LONG)(3_000_000)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith(PACKAGE[0])]:
            del sys.modules[name]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
    rows = [line.strip() for line in table.splitlines() if LONG in line]
    assert rows and rows[0].startswith(f"{LONG} (…/{PACKAGE[-1]})"), table
