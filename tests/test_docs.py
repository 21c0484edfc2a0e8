"""The documentation site builds without a warning, and every guide's code runs as shown.

Each page's ```python blocks run in order in one namespace, in a fresh directory; a
```text block right after a python block is the output it prints, compared as doctest
compares (``...`` matches anything, whitespace runs are one). A block that prints with
no output block after it fails, so no printed output goes unchecked. ```console blocks
run their ``$ `` lines in a shell (``python`` is this interpreter) and compare the rest
the same way. ```bash blocks are shown, not run (installs, GPU-only commands).
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "api" not in p.parts)
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def blocks(page: str) -> list[tuple[str, str, str | None]]:
    """(language, code, expected output or None) for every python and console block."""
    found = [(m.group(1), m.group(2)) for m in FENCE.finditer((DOCS / page).read_text())]
    out = []
    for i, (lang, code) in enumerate(found):
        if lang == "python":
            after = found[i + 1] if i + 1 < len(found) else None
            out.append((lang, code, after[1] if after and after[0] == "text" else None))
        elif lang == "console":
            out.append((lang, *console(code)))
    return out


def console(code: str) -> tuple[str, str]:
    """A console block's shell script (``$ `` lines, and a here-document's lines up to
    its ``EOF``) and the output it shows (every other line)."""
    script, want, heredoc = [], [], False
    for line in code.splitlines():
        if heredoc or line.startswith("$ "):
            script.append(line if heredoc else line[2:])
            heredoc = (heredoc and line != "EOF") or (not heredoc and "<<'EOF'" in line)
        else:
            want.append(line)
    return "".join(s + "\n" for s in script), "".join(w + "\n" for w in want)


def check_output(page: str, n: int, got: str, want: str | None) -> None:
    if want is None:
        assert not got, f"{page} block {n} prints but has no ```text block after it:\n{got}"
    elif not CHECKER.check_output(want, got, FLAGS):
        diff = CHECKER.output_difference(doctest.Example("", want), got, FLAGS)
        pytest.fail(f"{page} block {n}: printed output differs\n{diff}")


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.usefixtures("restore_registries")
def test_page_code_runs_and_prints_what_it_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a wrapper, not a link: a venv's python finds its venv
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    namespace: dict = {"__name__": "__docs__"}
    for n, (lang, code, want) in enumerate(blocks(page), 1):
        if lang == "python":
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(compile(code, f"docs/{page} block {n}", "exec"), namespace)
            got = buffer.getvalue()
        else:
            run = subprocess.run(
                code, shell=True, capture_output=True, text=True, env=env, timeout=120
            )
            got = run.stdout + run.stderr
            assert run.returncode == 0, f"{page} block {n} exits {run.returncode}:\n{got}"
        check_output(page, n, got, want)


def test_every_guide_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert f" {page}\n" in nav, f"docs/{page} is not listed in mkdocs.yml's nav"


def reexports(package: str) -> list[tuple[str, str]]:
    """(name, defining module) of each ``from m import name as name`` in the package."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    return [
        (alias.name, node.module)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
        if alias.asname == alias.name and not alias.name.startswith("_")
    ]


@pytest.mark.slow
def test_site_builds_strict_offline_with_every_public_name(tmp_path):
    """``mkdocs build --strict``: any warning (a docstring Griffe cannot parse, a broken
    link, a page missing from the nav) fails the build; and every name a package
    re-exports has its entry in the API reference."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARNING" not in run.stderr, run.stderr
    for package in ("fnnc.ops", "fnnc.graph", "fnnc.models", "fnnc.io", "fnnc.data"):
        page = "commands" if package == "fnnc.ops" else package.split(".")[1]
        html = (tmp_path / "api" / package.split(".")[1] / "index.html").read_text()
        html += (tmp_path / "api" / page / "index.html").read_text()
        missing = [
            name
            for name, module in reexports(package)
            if f'id="{package}.{name}"' not in html and f'id="{module}.{name}"' not in html
        ]
        assert not missing, f"{package} re-exports {missing} but the API reference lacks them"
    site = "".join(p.read_text() for p in tmp_path.rglob("*.html"))
    assert "fonts.googleapis.com" not in site  # readable offline too


def test_output_checks_catch_wrong_and_unshown_output():
    check_output("page.md", 1, "[1. 2.]\n", "[1.  2.]\n")  # whitespace runs are one
    check_output("page.md", 2, "loss 0.123456\n", "loss ...\n")
    with pytest.raises(pytest.fail.Exception, match="printed output differs"):
        check_output("page.md", 3, "True\n", "False\n")
    with pytest.raises(AssertionError, match="prints but has no"):
        check_output("page.md", 4, "something\n", None)
    script, want = console("$ echo a\n$ python - <<'EOF'\nprint(1)\nEOF\na\n1\n")
    assert script == "echo a\npython - <<'EOF'\nprint(1)\nEOF\n" and want == "a\n1\n"
