"""The matrix-multiply comparison: both libraries compute the same product, and the script runs."""

import pytest
import torch

from benchmarks import gemm_backends

pytestmark = pytest.mark.skipif(
    not gemm_backends.packed_linear_available(), reason="this PyTorch build has no oneDNN packed linear"
)


def test_packed_linear_computes_what_linear_computes():
    # the comparison is only fair if both sides compute the same thing: a transposed
    # or unpacked weight would give an error of order 1, not of float rounding
    result = gemm_backends.time_linear(out_features=96, in_features=64, rows=5, repeats=1)
    assert set(result) == {"blas", "onednn_packed", "max_abs_difference"}
    assert 0 <= result["max_abs_difference"] < 1e-4
    assert result["blas"] > 0 and result["onednn_packed"] > 0


def test_the_script_prints_both_tables_and_the_peak(capsys, monkeypatch):
    monkeypatch.setattr(gemm_backends, "SMOLLM2_LINEARS", (("small", 64, 32, 2),))
    monkeypatch.setattr(gemm_backends, "PEAK_N", 64)  # the real 2048 product takes seconds
    threads = torch.get_num_threads()
    try:
        assert gemm_backends.main(["--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "1 row(s) per call" in out and "32 row(s) per call" in out
    assert out.count("all linear layers of one decoding step") == 2
    assert "64 x 64 product" in out


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        gemm_backends.main(["--threads", "0"])
