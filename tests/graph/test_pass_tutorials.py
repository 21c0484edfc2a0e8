"""The pass tutorials in examples/ run and match their hand-computed oracles."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _main(name: str):
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=name)["main"]


def test_scale_folding_and_leaky_relu() -> None:
    result = _main("pass_scale_folding")()
    assert result["error"] < 1e-5 and result["check"] < 1e-12
    assert "mul" not in result["nodes"] and "leaky_relu" in result["nodes"]


def test_fake_quant_training() -> None:
    result = _main("pass_fake_quant")(steps=20)
    assert result["loss"] < 0.25 * result["first_loss"]
    assert result["error"] < 1e-4  # the model computes the quantized forward


@pytest.mark.usefixtures("restore_registries")  # it registers dense_relu and a backend
def test_custom_kernel() -> None:
    result = _main("pass_custom_kernel")()
    assert result["nodes"] == ["dense_relu", "gemm"] and result["backend"] == "my_kernel"
    assert result["error"] < 1e-5 and result["reference_error"] < 1e-5
