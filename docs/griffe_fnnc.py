"""A Griffe extension that reads fnnc's docstrings as the API reference should show them.

fnnc's public API is what each ``__init__.py`` re-exports with a redundant alias
(``from fnnc.graph.builder import GraphBuilder as GraphBuilder``, PEP 484's explicit
re-export); Griffe counts imported names as private unless told, so this marks those
public. The docstrings are Google style with two habits from Sphinx that Markdown does
not read: cross-reference roles (``:class:`Graph```) become links where the target is
documented (and code otherwise), and doctest runs outside an ``Examples:`` section
(``>>>`` at the margin) become fenced ``pycon`` blocks instead of Markdown quotes.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

# Griffe reads "Example:" as an admonition (Markdown, so ``>>>`` quotes) and
# "Examples:" as runnable examples; fnnc's docstrings mean the latter by both.
_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`(~?)([\w.]+)(?:\(\))?`")


def role_link(match: re.Match[str], module: str) -> str:
    tilde, target = match.groups()
    shown = target.rsplit(".", 1)[-1] if tilde else target
    # Relative names (``Graph``) resolve against the docstring's module; "optional"
    # leaves unknown targets as plain code, so a private or external name never warns.
    ident = target if target.startswith(("fnnc.", "jax.", "optax.")) else f"{module}.{target}"
    return f'<autoref identifier="{ident}" optional><code>{shown}</code></autoref>'


# RST's "text::" before an indented block: Markdown reads the block as code already.
_LITERAL = re.compile(r"::\n(?=\n)")
_BORDER = re.compile(r"^=+( +=+)+$")


def rst_tables(text: str) -> str:
    """RST simple tables (``=====  =====`` borders) as Markdown tables."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if not _BORDER.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        starts = [m.start() for m in re.finditer(r"=+", lines[i])]
        rows: list[list[str]] = []
        borders, i = 1, i + 1
        while i < len(lines) and borders < 3:
            line = lines[i]
            i += 1
            if _BORDER.match(line):
                borders += 1
                continue
            cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
            if rows and not cells[0] and borders == 2:
                rows[-1] = [f"{p} {c}".strip() for p, c in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        header, body = rows[0], rows[1:]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)


def fence_doctests(text: str) -> str:
    out: list[str] = []
    in_fence = in_run = False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_run and (not line.strip() or line.startswith("```")):
            out.append("```")
            in_run = False
        if not in_fence and not in_run and line.startswith(">>>"):
            out.append("```pycon")
            in_run = True
        out.append(line)
    if in_run:
        out.append("```")
    return "\n".join(out)


class FnncDocstrings(griffe.Extension):
    """Public re-exports, Sphinx roles as links, doctests as code blocks."""

    def on_module_members(self, *, node: Any, mod: griffe.Module, **kwargs: Any) -> None:
        if not isinstance(node, ast.Module):
            return
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom | ast.Import):
                for name in statement.names:
                    if name.asname and name.asname == name.name.rsplit(".", 1)[-1]:
                        member = mod.members.get(name.asname)
                        if member is not None:
                            member.public = True

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        module = obj.module.path if not obj.is_module else obj.path
        text = ROLE.sub(lambda m: role_link(m, module), obj.docstring.value)
        text = rst_tables(_EXAMPLE.sub(r"\1Examples:", text))
        obj.docstring.value = fence_doctests(_LITERAL.sub(":\n", text))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self.on_object(obj=pkg)  # the root package gets no on_object call
