"""The one rule for where this package's Triton kernels run (model/dispatch/triton_support.py)."""
from __future__ import annotations

import os

import pytest

from model.dispatch import triton_support


@pytest.mark.parametrize(
    "device, interpreted, runs",
    [("cuda", False, True), ("cuda", True, False), ("cpu", True, True), ("cpu", False, False), ("mps", True, False)],
)
def test_kernels_run_compiled_on_cuda_and_interpreted_on_the_cpu_only(device, interpreted, runs):
    why = triton_support.unavailable_reason(device, interpreted)
    assert (why is None) == runs, why
    if not runs:
        assert "TRITON_INTERPRET=1" in why  # the reason names the switch that decides it


def test_without_triton_every_device_says_so():
    for device in ("cuda", "cpu"):
        assert triton_support.unavailable_reason(device, None) == "Triton is not installed"


@pytest.mark.skipif(triton_support.triton is None, reason="triton is not installed")
def test_a_kernel_defined_here_reports_how_it_was_defined():
    from model.moe import triton_router

    assert triton_support.defined_interpreted(triton_router._route_topk_softmax_kernel) == triton_router.INTERPRETED
    # Triton chose from the environment at definition time.
    assert triton_router.INTERPRETED == (os.environ.get("TRITON_INTERPRET", "0") in ("1", "true", "on"))


def test_a_kernel_module_missing_only_triton_imports_as_none(tmp_path, monkeypatch):
    pkg = tmp_path / "kernels_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "needs_triton.py").write_text("raise ImportError('No module named triton', name='triton')\n")
    (pkg / "broken.py").write_text("import no_such_module_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert triton_support.import_if_triton(".needs_triton", "kernels_pkg") is None
    with pytest.raises(ImportError, match="no_such_module_here"):  # any other failure is not hidden
        triton_support.import_if_triton(".broken", "kernels_pkg")
