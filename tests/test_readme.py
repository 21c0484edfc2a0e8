"""Every ```python block of README.md runs as pasted, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

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
