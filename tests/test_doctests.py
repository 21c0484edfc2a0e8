"""Every ``>>>`` example in the package runs and prints what it says."""

import doctest
import importlib
import pkgutil

import pytest

import fnnc

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(fnnc.__path__, prefix="fnnc.")
    if m.name != "fnnc.__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"


@pytest.mark.parametrize("name", list(fnnc.ops.registry()))
def test_command_docstrings(name: str) -> None:
    """Command factories are not functions, so doctest's collector skips them: run each here."""
    opdef = fnnc.ops.lookup(name)
    parser = doctest.DocTestParser()
    test = parser.get_doctest(opdef.doc, {"ops": fnnc.ops}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} doctest(s) failed in command {name}"
