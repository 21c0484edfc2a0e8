"""Two local processes (``jax.distributed`` with gloo CPU collectives) train the digits
CNN as one device does on the same global batches (``examples/data_parallel.py``).

Both sides run as CPU processes of the example (``--devices 1`` is its single-device
reference), so on a GPU machine too the test compares process counts, not platforms."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data_parallel.py"


def _example():
    spec = importlib.util.spec_from_file_location("data_parallel_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLE.parent))
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "fsdp"])
def test_two_processes_match_one_device(tmp_path, capfd, fsdp):
    example = _example()
    flags = ["--epochs", "2", "--steps", "3", "--batch", "32", "--sgd", "--timeout", "240"]
    flags += ["--fsdp"] if fsdp else []
    two_path, one_path = tmp_path / "two.npz", tmp_path / "one.npz"
    # launches 2 workers on a free localhost port, kills them at the timeout
    assert example.main([*flags, "--processes", "2", "--save", str(two_path)]) == 0
    printed = capfd.readouterr().out
    # one device, the whole global batch (a CPU process, as the workers are)
    assert example.main([*flags, "--devices", "1", "--save", str(one_path)]) == 0
    alone = capfd.readouterr().out
    losses, want = (
        [float(x) for x in re.findall(r"epoch \d+: loss (\S+)", out)] for out in (printed, alone)
    )
    assert len(losses) == len(want) == 2, (printed, alone)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-5, err_msg=printed + alone)
    two, ref = np.load(two_path), np.load(one_path)
    assert sorted(two.files) == sorted(ref.files) and len(ref.files) == 16
    for key in ref.files:
        assert two[key].dtype == np.float32
        np.testing.assert_allclose(two[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)
