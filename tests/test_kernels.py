"""Triton kernel metadata parsed from inductor output, and the ``stepscope kernels`` command.

Fixtures: ``fixtures/kernels/handwritten`` holds kernels written in the shape of GPU inductor
output (list ``size_hints``, ``rnumel = N``); ``fixtures/kernels/inductor_cpu`` holds real output
of torch 2.13's inductor with its Triton CPU backend (see ``regenerate.py`` there).  Files end in
``.py.txt`` so linters skip them; the command tests copy them to ``.py``.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope import kernels
from stepscope.cli import main
from stepscope.config import config
from stepscope.tables import get_metric_table

pytestmark = pytest.mark.implementation_independent

FIXTURES = Path(__file__).parent / "fixtures" / "kernels"
HAND = FIXTURES / "handwritten"
REAL = FIXTURES / "inductor_cpu"

# KernelMetadata's fields: the kernel_metadata table's columns less kernel_path
COLUMNS = [f.name for f in dataclasses.fields(kernels.KernelMetadata)]

# file -> every field, in COLUMNS order (counted by hand from the fixture files)
HANDWRITTEN = {
    "pointwise_add_relu": (
        "triton_poi_fused_add_relu_0", "pointwise", "[1024]", None,
        12, 2, 1, 0, 0, 5, 1000, None, None, None,
    ),
    "pointwise_2d_transpose": (
        "triton_poi_fused_clone_transpose_0", "pointwise", "[256, 512]", None,
        13, 1, 1, 0, 0, 6, 320, 192, None, None,
    ),
    "reduction_softmax_looped": (
        "triton_red_fused__softmax_0", "reduction", "[32, 65536]", "INNER",
        39, 3, 1, 3, 0, 6, 32, None, 50257, 0.012865792,
    ),
    "persistent_reduction_layer_norm": (
        "triton_per_fused_native_layer_norm_0", "persistent_reduction", "[4096, 1024]", "INNER",
        37, 3, 2, 0, 0, 8, 4096, None, 768, 0.025204736,
    ),
    "atomic_add_index_put": (
        "triton_poi_fused_index_put_1", "pointwise", "[8192]", None,
        16, 2, 0, 0, 2, 6, 5000, None, None, None,
    ),
    "foreach_add": (
        "triton_for_fused_0", "foreach", None, None,
        27, 4, 2, 0, 0, 6, 100, None, None, None,
    ),
    "template_mm": (
        "triton_tem_fused_mm_0", "template", None, None,
        39, 2, 1, 1, 0, 3, None, None, None, 0.000786432,
    ),
}  # fmt: skip

# real inductor kernel modules (torch 2.13, Triton CPU backend)
REAL_MODULES = {
    "pw/pd/cpd3y4swojrltdj2jbkhbdw3afjxknoeofhllut3bhl5gugcallp": (
        "triton_poi_fused_add_mul_0", "pointwise", "{'x': 1024}", None,
        12, 1, 1, 0, 0, 4, 1000, None, None, None,
    ),
    "pw2d/en/cenx4e2dt2inusxqucdsev54sobfnetys2cie3fahlo773mxkwhm": (
        "triton_poi_fused_add_clone_t_0", "pointwise", "{'y': 256, 'x': 512}", None,
        15, 1, 1, 0, 0, 6, 300, 200, None, None,
    ),
    "red/wx/cwxgrtao2i3poarc2kpqfkdsl7hgaeatfnhd7uwcjtetkvtymsfx": (
        "triton_red_fused_sum_0", "reduction", "{'x': 8, 'r0_': 131072}", "INNER",
        24, 1, 1, 1, 0, 6, 8, None, 100000, None,
    ),
    "per/tp/ctpnd7gdmmhs7a7kqjk2o735mijtj6dn2myupmnniikpzsw4lx3l": (
        "triton_per_fused__softmax_0", "persistent_reduction", "{'x': 64, 'r0_': 1024}", "INNER",
        27, 1, 1, 0, 0, 5, 64, None, 1000, None,
    ),
    "foreach/ze/czex3mfhcnbtin4fwfmw46vq5xi2n3yloev4oephqen3gmffo25r": (
        "triton_for_fused_0", "foreach", None, None,
        31, 4, 2, 0, 0, 6, 100, None, 1, None,
    ),
    "bw/cn/ccnumkxezloac4otluahwbjvtfvruwaosaq5h3pcqebuudo2souc": (
        "triton_red_fused_sum_0", "reduction", "{'x': 8, 'r0_': 131072}", "INNER",
        24, 1, 1, 1, 0, 6, 8, None, 100000, 0.003200032,
    ),
    # benchmark_kernel=True on CPU: inductor indents two imports wrongly, so this module does not
    # even import; its kernel is still read.  kernel_num_gb is 8e-06 (the seed's [0-9.]+ read 8).
    "bench/pq/cpqzmmj3jiccp36vga43trofy745ffftimysp7pr6kofs6zyklfd": (
        "triton_poi_fused_add_mul_0", "pointwise", "{'x': 1024}", None,
        12, 1, 1, 0, 0, 4, 1000, None, None, 8e-06,
    ),
}  # fmt: skip


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fields(meta: kernels.KernelMetadata) -> tuple[Any, ...]:
    return tuple(getattr(meta, c) for c in COLUMNS)


def test_metadata_fields_are_the_table_columns_less_the_path() -> None:
    columns = get_metric_table("kernel_metadata").column_names
    assert [c for c in columns if c != "kernel_path"] == COLUMNS


@pytest.mark.parametrize("name", sorted(HANDWRITTEN))
def test_handwritten_kernels_give_every_field(name: str) -> None:
    meta = kernels.parse_kernel_metadata(read(HAND / f"{name}.py.txt"))
    assert fields(meta) == HANDWRITTEN[name]


@pytest.mark.parametrize("name", sorted(REAL_MODULES))
def test_real_inductor_modules_give_every_field(name: str) -> None:
    meta = kernels.parse_kernel_metadata(read(REAL / f"{name}.py.txt"))
    assert fields(meta) == REAL_MODULES[name]


def test_real_benchmark_module_is_not_valid_python_but_still_parses() -> None:
    text = read(REAL / "bench/pq/cpqzmmj3jiccp36vga43trofy745ffftimysp7pr6kofs6zyklfd.py.txt")
    with pytest.raises(SyntaxError):
        compile(text, "kernel.py", "exec")
    assert kernels.parse_kernel_metadata(text).kernel_args_num_gb == pytest.approx(8e-06)


def test_wrapper_module_yields_embedded_kernels_with_their_paths() -> None:
    text = read(REAL / "atomic/xv/cxveit4gmvkjqgwzdh55ptphwedbrzf3hyzyljcs6gugbs5psp7g.py.txt")
    found = list(kernels.iter_kernel_sources(text))
    assert [(name, path) for name, _, path in found] == [
        (
            "triton_poi_fused_zeros_0",
            "/tmp/gen2/cache/4o/c4oxghj7375knjddicuv3yqbtgmiyu4pkf422r2axumkse3ofthm.py",
        ),
        (
            "triton_poi_fused_index_put_zeros_1",
            "/tmp/gen2/cache/mb/cmbenl3dsrxabrl764oz33jmxtnoxypcbkdiveg2oo2ofsyoynan.py",
        ),
    ]
    atomic = kernels.parse_kernel_metadata(found[1][1])
    assert (atomic.num_atomic_add, atomic.num_load, atomic.num_store, atomic.xnumel) == (
        1,
        2,
        0,
        5000,
    )
    # the embedded copy of a kernel reads the same as its own module file
    module = read(REAL / "atomic/4o/c4oxghj7375knjddicuv3yqbtgmiyu4pkf422r2axumkse3ofthm.py.txt")
    assert kernels.parse_kernel_metadata(found[0][1]) == kernels.parse_kernel_metadata(module)


def test_kernel_module_yields_itself_and_other_files_yield_nothing() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt")
    assert list(kernels.iter_kernel_sources(text)) == [(None, text, None)]
    assert list(kernels.iter_kernel_sources("import torch\nprint('hi')\n")) == []
    # a plain @triton.jit module without inductor's heuristics is not inductor output
    plain = "import triton\n\n@triton.jit\ndef add(x_ptr):\n    pass\n"
    assert list(kernels.iter_kernel_sources(plain)) == []


def test_extract_kernel_returns_decorators_and_function() -> None:
    source = kernels.extract_kernel(read(HAND / "pointwise_add_relu.py.txt"))
    assert source.name == "triton_poi_fused_add_relu_0"
    assert source.fn_code.startswith("@triton_heuristics.pointwise(\n    size_hints=[1024], \n")
    assert "@triton.jit\ndef triton_poi_fused_add_relu_0(" in source.fn_code
    assert source.proper_code.startswith("def triton_poi_fused_add_relu_0(in_ptr0, in_ptr1,")
    assert source.proper_code.endswith("    tl.store(out_ptr0 + (x0), tmp4, xmask)\n")
    assert source.first_line == 10


def test_kernel_category_by_decorator() -> None:
    assert kernels.kernel_category(read(HAND / "foreach_add.py.txt")) == "foreach"
    odd = read(HAND / "pointwise_add_relu.py.txt").replace(
        "triton_heuristics.pointwise(", "triton_heuristics.something_new("
    )
    assert kernels.kernel_category(odd) == "unknown"
    meta = kernels.parse_kernel_metadata(odd)
    assert (meta.kernel_category, meta.size_hints) == ("unknown", "[1024]")


def test_comments_are_not_counted_as_code() -> None:
    # the template's comment "one iteration for each BLOCK_K slice" is no loop (seed counted it)
    text = read(HAND / "template_mm.py.txt")
    assert "# one iteration for each" in text
    assert kernels.parse_kernel_metadata(text).num_for_loop == 1


def test_helper_jit_functions_are_not_the_kernel() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt")
    helper = "\n@triton.jit\ndef _helper(x):\n    return tl.load(x)\n\n"
    marker = "@triton_heuristics.pointwise("
    meta = kernels.parse_kernel_metadata(text.replace(marker, helper + marker))
    assert (meta.kernel_name, meta.num_load) == ("triton_poi_fused_add_relu_0", 2)


def test_scientific_notation_num_gb_in_a_non_literal_meta() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt").replace(
        "inductor_meta={'autotune_hints'",
        "inductor_meta=dict(**{'kernel_num_gb': 1.5e-05}) or {'a'",
    )
    assert kernels.parse_kernel_metadata(text).kernel_args_num_gb == pytest.approx(1.5e-05)


# -- malformed sources give ValueErrors naming the field ---------------------------------------


def test_missing_size_hints_names_the_field() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt").replace("size_hints=[1024], ", "")
    with pytest.raises(ValueError, match=r"size_hints not found .*pointwise.*add_relu"):
        kernels.parse_kernel_metadata(text)


def test_missing_reduction_hint_names_the_field() -> None:
    text = read(HAND / "reduction_softmax_looped.py.txt").replace(
        "reduction_hint=ReductionHint.INNER,", ""
    )
    with pytest.raises(ValueError, match=r"reduction_hint=ReductionHint.<NAME> not found"):
        kernels.parse_kernel_metadata(text)


def test_missing_kernel_function() -> None:
    with pytest.raises(ValueError, match="kernel function not found"):
        kernels.parse_kernel_metadata("import triton\nx = 1\n")
    with pytest.raises(ValueError, match=r"no .def. follows the @triton\.jit on line 2"):
        kernels.parse_kernel_metadata("import triton\n@triton.jit\nx = 1\n")


def test_two_kernels_in_one_module_are_ambiguous() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt")
    second = text.replace("triton_poi_fused_add_relu_0", "triton_poi_fused_add_relu_1")
    with pytest.raises(ValueError, match=r"ambiguous: 2 @triton.jit functions .*add_relu_1"):
        kernels.parse_kernel_metadata(text + "\n" + second)


def test_broken_kernel_function_is_reported_with_its_line() -> None:
    text = read(HAND / "pointwise_add_relu.py.txt").replace("tmp2 = tmp0 + tmp1", "tmp2 = (tmp0 +")
    with pytest.raises(
        ValueError, match=r"triton_poi_fused_add_relu_0' is not valid Python \(line"
    ):
        kernels.parse_kernel_metadata(text)


def test_malformed_num_gb() -> None:
    text = read(HAND / "template_mm.py.txt").replace(
        "'kernel_num_gb': 0.000786432", "'kernel_num_gb': 'x'"
    )
    with pytest.raises(
        ValueError, match="kernel_num_gb of kernel 'triton_tem_fused_mm_0' is not a number"
    ):
        kernels.parse_kernel_metadata(text)


def test_non_str_source_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be str"):
        kernels.parse_kernel_metadata(b"@triton.jit")  # type: ignore[arg-type]


# -- log_kernel_metadata ---------------------------------------------------------------------


def test_log_kernel_metadata_writes_a_row_only_when_enabled(tmp_path: Path) -> None:
    table = get_metric_table("kernel_metadata")
    with config.patch(tables_dir=str(tmp_path), metric_tables="", run_name="resnet50"):
        # disabled: the source is not even parsed, so a broken one costs nothing
        kernels.log_kernel_metadata("k", "/k.py", "not a kernel")
        assert not (tmp_path / "metric_table_kernel_metadata.csv").exists()
        config.metric_tables = "kernel_metadata"
        kernels.log_kernel_metadata(
            "triton_red_fused__softmax_0",
            "/cache/ab/cabc.py",
            read(HAND / "reduction_softmax_looped.py.txt"),
        )
        table.close()
    data = (tmp_path / "metric_table_kernel_metadata.csv").read_bytes()
    assert data == (
        b"model_name,kernel_name,kernel_path,kernel_category,size_hints,reduction_hint,"
        b"line_of_code,num_load,num_store,num_for_loop,num_atomic_add,num_args,xnumel,ynumel,"
        b"rnumel,kernel_args_num_gb\n"
        b'resnet50,triton_red_fused__softmax_0,/cache/ab/cabc.py,reduction,"[32, 65536]",INNER,'
        b"39,3,1,3,0,6,32,,50257,0.012866\n"
    )


def test_log_kernel_metadata_raises_for_malformed_source_when_enabled(tmp_path: Path) -> None:
    with (
        config.patch(tables_dir=str(tmp_path), metric_tables="kernel_metadata"),
        pytest.raises(ValueError, match="kernel function not found"),
    ):
        kernels.log_kernel_metadata("k", "/k.py", "def f(): pass\n")
    get_metric_table("kernel_metadata").close()


# -- the command -----------------------------------------------------------------------------


def as_python_tree(src: Path, dst: Path) -> Path:
    """Copy fixture files to ``dst`` with their real ``.py`` names."""
    for path in src.rglob("*.py.txt"):
        out = dst / path.relative_to(src).with_suffix("")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out)
    return dst


def csv_rows(path: Path) -> list[list[str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_command_scans_a_cache_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = as_python_tree(REAL, tmp_path / "cache")
    out = tmp_path / "out" / "kernels.csv"
    assert main(["kernels", str(cache), "-o", str(out), "--run-name", "cpu-run"]) == 0
    rows = csv_rows(out)
    assert rows[0] == ["model_name", *get_metric_table("kernel_metadata").column_names]
    by_path = {r[2]: r for r in rows[1:]}
    # 8 module files; the wrappers add only the one kernel that has no module file of its own
    assert len(rows) - 1 == 9
    own = str(cache / "red/wx/cwxgrtao2i3poarc2kpqfkdsl7hgaeatfnhd7uwcjtetkvtymsfx.py")
    assert by_path[own] == [
        "cpu-run", "triton_red_fused_sum_0", own, "reduction", "{'x': 8, 'r0_': 131072}",
        "INNER", "24", "1", "1", "1", "0", "6", "8", "", "100000", "",
    ]  # fmt: skip
    embedded = "/tmp/gen2/cache/mb/cmbenl3dsrxabrl764oz33jmxtnoxypcbkdiveg2oo2ofsyoynan.py"
    assert by_path[embedded][1] == "triton_poi_fused_index_put_zeros_1"
    assert by_path[embedded][10] == "1"  # num_atomic_add
    err = capsys.readouterr().err
    assert f"9 kernels from 16 files -> {out}" in err
    assert "[" not in err  # no progress bar: not a terminal and a small directory


def test_command_reports_broken_files_and_writes_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = as_python_tree(HAND, tmp_path / "tree")
    broken = tree / "zz_broken.py"
    broken.write_text(
        read(HAND / "reduction_softmax_looped.py.txt").replace(
            "reduction_hint=ReductionHint.INNER,", ""
        )
    )
    (tree / "not_utf8.py").write_bytes(b"\xff\xfe@triton.jit")
    (tree / "notes.txt").write_text("ignored: not a .py file")
    out = tmp_path / "k.csv"
    assert main(["kernels", str(tree), "-o", str(out), "--progress", "always"]) == 1
    rows = csv_rows(out)
    assert sorted(r[1] for r in rows[1:]) == sorted(v[0] for v in HANDWRITTEN.values())
    assert all(r[0] == "" for r in rows[1:])  # no run name configured
    err = capsys.readouterr().err
    assert f"cannot parse {broken}: reduction_hint=ReductionHint.<NAME> not found" in err
    assert f"cannot parse {tree / 'not_utf8.py'}: cannot read" in err
    assert f"[{'#' * 30}] 9/9 files 7 kernels" in err
    assert "7 kernels from 9 files, 2 failed" in err


def test_command_errors_for_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["kernels", str(tmp_path / "nope"), "-o", str(tmp_path / "k.csv")]) == 1
    assert f"stepscope kernels: error: directory not found: {tmp_path / 'nope'}" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "k.csv").exists()
    afile = tmp_path / "f.py"
    afile.write_text("")
    assert main(["kernels", str(afile)]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_command_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    tree = as_python_tree(HAND, tmp_path / "tree")
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.cli", "kernels", str(tree), "-o", "k.csv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "STEPSCOPE_RUN_NAME": "from-env"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = csv_rows(tmp_path / "k.csv")
    assert len(rows) == 8 and {r[0] for r in rows[1:]} == {"from-env"}
