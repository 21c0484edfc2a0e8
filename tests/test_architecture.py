"""The package's layering: imports point down, and what is registered never depends on
what was imported first."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fnnc"

# package -> fnnc packages it must never import (inside functions included)
BANNED = {
    "core": ("ops", "graph", "io", "models", "data"),
    "ops": ("graph", "io", "models", "data"),
    "graph": ("models", "data"),
    "io": ("graph", "models", "data", "ops"),
    "data": ("graph", "models"),
}
CORE_ALLOWED = {"core", "errors", "config"}


def _imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[tuple[int, str]]:
    """Every absolute or relative import of ``path`` as (line, absolute module name)."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
    return out


def _violations(root: pathlib.Path = ROOT) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) < 2:
            continue  # fnnc/__init__.py, errors.py, config.py: the top and the ground
        pkg = parts[0]
        banned = BANNED.get(pkg, ())
        if "pallas" in parts:
            banned = (*banned, "graph")
        for line, module in _imports(path, root):
            bits = module.split(".")
            if bits[0] != "fnnc" or len(bits) < 2:
                continue
            if bits[1] in banned or (pkg == "core" and bits[1] not in CORE_ALLOWED):
                found.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return found


def test_imports_point_down_the_layers():
    assert _violations() == []


def test_the_scan_sees_imports_inside_functions(tmp_path):
    # a package of its own: a probe written into fnnc/ops raced the scan of the real
    # package when xdist ran both tests at once
    probe = tmp_path / "fnnc" / "ops" / "_probe_for_layer_test.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from fnnc.graph import compile\n")
    assert any("_probe_for_layer_test" in v for v in _violations(tmp_path / "fnnc"))


ORDERS = {
    "ops": "import fnnc.ops",
    "graph": "import fnnc.graph",
    "core": "import fnnc.core",
    "models": "import fnnc.models",
    "io": "import fnnc.io",
}


@pytest.mark.parametrize("first", list(ORDERS))
def test_registry_is_the_same_whatever_is_imported_first(first):
    code = (
        f"{ORDERS[first]}\n"
        "from fnnc.core.command import registry\n"
        "print(','.join(sorted(registry())))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    import fnnc.models  # noqa: F401 - everything loaded here
    from fnnc import ops

    assert out.split(",") == sorted(ops.registry())
    assert {"call", "write_view", "gradient", "while_loop", "fused_elementwise"} <= set(
        out.split(",")
    )


# NumPy's issubdtype counts bfloat16 (an ml_dtypes void-kind scalar) as neither floating
# nor inexact: checks so written silently treated bfloat16 tensors as integers (no
# dynamic-graph gradients, per-class bfloat16 targets fused as class indices)
NUMPY_FLOAT_KIND = re.compile(r"issubdtype\([^)]*(?<![\w.])np\.(floating|inexact)")


def test_float_kinds_are_asked_of_fnnc_core_dtypes_not_numpy():
    found = [
        f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()}"
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "core" / "dtypes.py"  # which says why
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if NUMPY_FLOAT_KIND.search(line)
    ]
    assert not found, "use fnnc.core.dtypes.is_floating / is_inexact:\n" + "\n".join(found)
