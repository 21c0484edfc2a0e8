"""MkDocs hooks: API reference pages listed from what each package re-exports.

An API page holds a marker, ``<!-- fnnc:exports fnnc.graph -->``, that expands to one
mkdocstrings block per name the package's ``__init__.py`` re-exports (``from x import
y as y``), in source order, so a name added there appears in the reference without
editing a page. ``<!-- fnnc:commands -->`` expands to every registered command
(``fnnc.ops.registry()``): command factories are values built by ``defcommand``, not
functions, so the registry, not the source, is where their signature and docs live.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import re
import sys
from typing import Any

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "docs")]  # fnnc from this checkout; griffe_fnnc

from griffe_fnnc import ROLE, fence_doctests, role_link  # noqa: E402

_EXPORTS = re.compile(r"^<!-- fnnc:exports ([\w.]+) -->$", re.M)
_COMMANDS = "<!-- fnnc:commands -->"


def exports(package: str) -> list[tuple[str, str]]:
    """(name, defining module) for every redundant-alias import in ``package``'s ``__init__``."""
    path = _ROOT / package.replace(".", "/") / "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.asname == alias.name and not alias.name.startswith("_"):
                    found.append((node.lineno, alias.name, node.module))
    return [(name, module) for _, name, module in sorted(found)]


def _is_command(value: Any) -> bool:
    return type(value).__name__ == "_Factory"


def _block(package: str, name: str, module: str) -> str:
    value = getattr(importlib.import_module(package), name)
    if inspect.ismodule(value):
        path = value.__name__
    elif importlib.util.find_spec(f"{package}.{name}") is not None:
        # A submodule of the same name hides the re-export from Griffe (e.g.
        # fnnc.graph.compile): document it where it is defined.
        path = f"{module}.{name}"
    else:
        path = f"{package}.{name}"
    return f"::: {path}\n    options:\n      heading_level: 2\n      show_root_full_path: false\n"


def exports_markdown(package: str) -> str:
    """The mkdocstrings blocks for ``package``'s re-exports (commands left to their page)."""
    mod = importlib.import_module(package)
    blocks = [
        _block(package, name, module)
        for name, module in exports(package)
        if not _is_command(getattr(mod, name))
    ]
    return "\n".join(blocks)


def _command_section(name: str, opdef: Any) -> str:
    sig = inspect.signature(opdef.forward)
    inputs = [p for p in sig.parameters.values() if p.kind != p.KEYWORD_ONLY]
    params = [p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    flags = [f for f, on in vars_of(opdef.attributes).items() if on is True]
    uses = opdef.backward_uses
    lines = [
        f"### `{name}` {{ #fnnc.ops.{name} }}",
        "",
        "```python",
        f"ops.{name}({', '.join(str(p) for p in params)})({', '.join(str(p) for p in inputs)})",
        "```",
        "",
        f"Family `{opdef.family}`; the backward reads "
        f"{'all inputs' if uses.inputs is None else f'inputs {list(uses.inputs)}'}"
        f" and outputs {list(uses.outputs)}"
        + (f"; {', '.join(f'`{f}`' for f in flags)}." if flags else "."),
        "",
    ]
    doc = inspect.cleandoc(opdef.doc or "")
    lines.append(fence_doctests(ROLE.sub(lambda m: role_link(m, "fnnc.ops"), doc)))
    return "\n".join(lines) + "\n"


def vars_of(record: Any) -> dict[str, Any]:
    return {f: getattr(record, f) for f in record.__dataclass_fields__}


def commands_markdown() -> str:
    """One section per public registered command, grouped by family (first seen first)."""
    from fnnc import ops

    families: dict[str, list[str]] = {}
    for name, opdef in ops.registry().items():
        if hasattr(ops, name):  # tests and internal modules register private ones
            families.setdefault(opdef.family, []).append(_command_section(name, opdef))
    return "\n".join(
        f"## {family.capitalize()}\n\n" + "\n".join(sections)
        for family, sections in families.items()
    )


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    markdown = _EXPORTS.sub(lambda m: exports_markdown(m.group(1)), markdown)
    if _COMMANDS in markdown:
        markdown = markdown.replace(_COMMANDS, commands_markdown())
    return markdown
