"""Audit 9 (review fixes): autotune tables are read only at the version fnnc writes."""

from __future__ import annotations

import json
import warnings

import pytest

from fnnc.errors import GraphFormatError
from fnnc.ops import autotune


@pytest.fixture
def table():
    saved = dict(autotune.TABLE)
    autotune.TABLE.clear()
    yield autotune.TABLE
    autotune.TABLE.clear()
    autotune.TABLE.update(saved)


def _file(tmp_path, version):
    path = tmp_path / "t.json"
    data = {"format": autotune.FORMAT, "version": version, "entries": {"k": "xla"}}
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("version", [True, 1, 0, 1.0, "2", None])
def test_a_version_fnnc_never_writes_is_refused(tmp_path, table, version):
    """``version: true`` (a bool is an int) and ``version: 1`` under the format key
    (version 1 had no format key) loaded as version 2; now each is a GraphFormatError
    naming the version, and nothing is loaded (oracle: the file format fnnc writes)."""
    path = _file(tmp_path, version)
    with pytest.raises(GraphFormatError, match=rf"version {version!r}, which fnnc never writes"):
        autotune.load(path)
    assert table == {}
    with pytest.raises(GraphFormatError, match="never writes"):  # save leaves it as it is
        autotune.save(path)
    assert json.loads(path.read_text())["version"] == version


def test_the_written_version_and_the_legacy_table_still_load(tmp_path, table):
    """Version 2 loads its entries; a version-1 table (entries alone) loads none, with
    its warning; a newer version asks for a newer fnnc."""
    autotune.load(_file(tmp_path, 2))
    assert table == {"k": "xla"}
    legacy = tmp_path / "v1.json"
    legacy.write_text(json.dumps({"old": "xla"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autotune.load(legacy)
    assert table == {"k": "xla"} and "earlier fnnc" in str(caught[0].message)
    with pytest.raises(GraphFormatError, match="upgrade fnnc"):
        autotune.load(_file(tmp_path, 3))
