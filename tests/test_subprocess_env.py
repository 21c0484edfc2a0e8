"""Child processes the tests start see this checkout and the parent's PYTHONPATH.

On the GPU machines grain is installed with ``pip install --target`` into a folder on
``PYTHONPATH``; a child whose environment replaced that variable lost it (the SIGKILL
training test failed there with ``No module named 'grain'``).
"""

import subprocess
import sys

from tests.helpers import ROOT, subprocess_env

CHILD = """
import importlib.util, os, pathlib
import only_on_the_parents_path
print(pathlib.Path(importlib.util.find_spec("fnnc").origin).parents[1])
print(os.environ["JAX_PLATFORMS"])
"""


def test_a_child_finds_this_checkout_and_the_parents_pythonpath(tmp_path, monkeypatch):
    extra, elsewhere = tmp_path / "site", tmp_path / "cwd"
    extra.mkdir()
    elsewhere.mkdir()
    (extra / "only_on_the_parents_path.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(extra))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=elsewhere, env=subprocess_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ROOT), "cpu"]
