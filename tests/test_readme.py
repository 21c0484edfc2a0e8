"""Every ```python block of README.md runs as pasted, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

from tests.helpers import run_on_cpu_devices

README = pathlib.Path(__file__).parents[1] / "README.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_snippets_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets write files (digits.sqlite3, run.ckpt)
    found = blocks()
    assert len(found) >= 4
    namespace: dict = {"__name__": "readme"}
    for i, code in enumerate(found):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    assert (tmp_path / "run.ckpt").exists()


def test_model_parallel_snippet_runs_on_the_examples_model_as_one_device_does():
    """The model-parallel block (shown, not run above: it needs 4 devices) runs as
    written from examples/, keeps Megatron's table under its rule, and its first loss is
    the one-device loss of the same model and batch."""
    fences = re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    (snippet,) = [code for _, code in fences if "from model_parallel import" in code]
    examples = README.parent / "examples"
    script = f"import sys\nsys.path.insert(0, {str(examples)!r})\n{snippet}\n" + CHECKS
    run_on_cpu_devices(script)


CHECKS = """
import numpy as np
from model_parallel import train
specs = {pid: v.sharding.spec for pid, v in model.engine.values.items()}
assert specs["t-reverser-0-logits-0-0"] == PartitionSpec(None, "model"), specs
assert not any(specs["t-reverser-0-logits-0-1"]), specs  # the bias stays whole
assert specs["t-reverser-0-mlp0a-0-0"] == PartitionSpec("model"), specs  # Megatron's
shard = model.engine.values["t-reverser-0-logits-0-0"].addressable_shards[0].data
assert shard.shape == (16, 16), shard.shape  # [vocab 16, width 32] split in two
_, (one,) = train([(x, y)])  # the same model on one device
assert abs(float(loss) - one) < 1e-5, (float(loss), one)
print("OK")
"""
