"""Examples run end to end (smoke mode) and print what they promise."""

import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import subprocess_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_graph_tour(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["graph_tour.py"])  # not pytest's own arguments
    runpy.run_path(str(EXAMPLES / "graph_tour.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "interpret: 0.879953" in out and "compile:   0.879953" in out
    assert "gemm" in out and "relu" in out
    assert "argument_bytes" in out


def test_custom_pass_tutorial(capsys):
    ns = runpy.run_path(str(EXAMPLES / "custom_pass.py"), run_name="custom_pass")
    result = ns["main"]()
    assert result["erfc"] == 0 and result["gelu"] == 2  # the pass fired on both layers
    assert 0 < result["error"] < 2e-3  # the tanh approximation, not a different function


def test_digits_demo_reaches_97_percent():
    ns = runpy.run_path(str(EXAMPLES / "digits.py"), run_name="digits")
    result = ns["main"](epochs=12, progress=False)
    assert result["accuracy"] >= 0.97, result


def test_transformer_smoke():
    ns = runpy.run_path(str(EXAMPLES / "transformer.py"), run_name="transformer")
    result = ns["main"](steps=60, batch_size=32)
    assert result["loss"] < 0.5 * result["first_loss"]
    assert result["accuracy"] > 0.3  # chance is 0.1; the full run reaches 1.0


def test_textual_inversion_trains_only_the_pseudo_token():
    ns = runpy.run_path(str(EXAMPLES / "textual_inversion.py"), run_name="textual_inversion")
    result = ns["main"](pretrain_steps=300, inversion_steps=150)
    assert result["pretrained"] > 0.9
    assert result["hit"] > 0.9 and result["unchanged"] == 1.0


def test_moe_example_trains_and_reports_expert_load(capsys):
    ns = runpy.run_path(str(EXAMPLES / "moe.py"), run_name="moe")
    result = ns["main"](steps=60, batch_size=32)
    assert result["loss"] < 0.5 * result["first_loss"]
    for share in result["load"]:  # every routed row is counted once, top-2 of 4 experts
        assert abs(float(share.sum()) - 1.0) < 1e-6 and len(share) == 4
    assert "expert load, layer 1:" in capsys.readouterr().out


def test_model_parallel_example_on_a_2x2_mesh_matches_one_device():
    # its own process: the script adds 4 devices to XLA_FLAGS before importing JAX, and
    # keeps flags a user set already (here one that changes nothing)
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "model_parallel.py"), "--steps", "3", "--compare"],
        capture_output=True, text=True, timeout=600,
        env=subprocess_env(XLA_FLAGS="--xla_cpu_enable_fast_min_max=false"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "t-reverser-0-mlp0a-0-0       [128, 32]  P('model',)          [64, 32]" in text
    assert "device 3: 56000 bytes (52%)" in text and "parameters: 107072 bytes" in text
    assert "step 3: loss" in text
    gap = float(text.split("largest loss difference to one device: ")[1].split()[0])
    assert gap < 1e-5


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_answers_help_without_running(name):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--help"], capture_output=True, text=True,
        env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith(f"usage: {name}"), out.stderr
    assert "==" not in out.stdout and "accuracy" not in out.stdout  # nothing ran
    # the description is the docstring's whole first paragraph, not a line cut mid-sentence
    doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text()))
    assert " ".join(doc.split("\n\n")[0].split()) in " ".join(out.stdout.split())


@pytest.mark.parametrize(
    "name, argv, message",
    [
        (
            "transformer.py",
            ["--steps", "0"],
            "argument --steps: expected a positive integer, got 0",
        ),
        ("moe.py", ["--steps", "-3"], "argument --steps: expected a positive integer, got -3"),
        ("model_parallel.py", ["--steps", "0"], "argument --steps: expected a positive integer"),
        ("model_parallel.py", ["--batch", "0"], "argument --batch: expected a positive integer"),
        ("digits.py", ["--epochs", "0"], "argument --epochs: expected a positive integer"),
        ("textual_inversion.py", ["--inversion-steps", "0"], "expected a positive integer"),
        ("data_parallel.py", ["--batch", "0"], "argument --batch: expected a positive integer"),
        ("data_parallel.py", ["--steps", "-1"], "argument --steps: expected an integer >= 0"),
        # each step would feed 30 of 32 images, silently (32 // 3 per process)
        ("data_parallel.py", ["--processes", "3"], "--batch 32 does not split over 3 processes"),
        # digits has int(0.8 * 1797) = 1437 training images: 44 full batches of 32; the
        # steps past them trained on empty batches (NaN loss), --batch 2000 divided by 0
        ("data_parallel.py", ["--steps", "45"], "= 1440 images per epoch, more than the 1437"),
        ("data_parallel.py", ["--batch", "2000"], "--batch 2000 is larger than the 1437"),
    ],
)
def test_examples_refuse_counts_that_would_train_nothing(name, argv, message):
    # argparse rejects them before any training (transformer.py --steps 0 used to raise
    # UnboundLocalError after compiling, model_parallel.py --steps 0 an IndexError)
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *argv], capture_output=True, text=True,
        env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
    assert out.stdout == ""


def test_transformer_without_extra_steps_reports_its_first_loss():
    ns = runpy.run_path(str(EXAMPLES / "transformer.py"), run_name="transformer")
    result = ns["main"](steps=0, batch_size=2)
    assert result["loss"] == result["first_loss"]  # main() called directly may train 0 steps


PUBLIC = {"fnnc", "fnnc.ops", "fnnc.graph", "fnnc.models", "fnnc.io", "fnnc.data", "fnnc.errors"}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_examples_import_fnnc_only_through_its_public_packages(name):
    """What users copy from must not reach into private modules (digits.py used
    fnnc.models.train.accuracy, pass_custom_kernel.py fnnc.core.command.make_command)."""
    tree = ast.parse((EXAMPLES / name).read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    private = [m for m in modules if m.split(".")[0] == "fnnc" and m not in PUBLIC]
    assert not private, f"{name} imports {private}; use {sorted(PUBLIC)}"


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_every_example_is_listed_where_users_look_for_them(page):
    text = (EXAMPLES.parent / page).read_text()
    missing = sorted(p.name for p in EXAMPLES.glob("*.py") if f"{p.name}`" not in text)
    assert not missing, f"{page} does not list {missing}"
