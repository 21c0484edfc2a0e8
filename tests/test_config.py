"""fnnc.config checks every setting's kind in one place: ``checks="numerics"`` (issue 16's
spelling, as in ``FNNC_CHECKS=numerics``) turns the numerics check on, and any other value
of the wrong kind is a ConfigError naming the setting, the value and what it accepts."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import ConfigError, NumericsError
from fnnc.graph import GraphBuilder, compile, interpret


def _log_graph():
    b = GraphBuilder()
    a = b.input((2,), name="a")
    return b.build([b.exec(ops.ewlog(), a, name="thelog")])


def test_checks_numerics_turns_the_numerics_check_on():
    graph = _log_graph()
    bad = np.float32([-1.0, 1.0])
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.log(bad)).any()  # the oracle: log(-1) is NaN
    with config.override(checks="numerics"):
        assert config.get().checks is True
        assert config.get().numerics is True
        with pytest.raises(NumericsError, match=r"thelog"):
            compile(graph)(bad)
        with pytest.raises(NumericsError, match=r"thelog"):
            interpret(graph, bad)
    assert config.get().numerics is False  # restored on exit
    with (
        pytest.raises(ConfigError, match=r"checks='numerics'.*numerics=False"),
        config.override(checks="numerics", numerics=False),
    ):
        pass


@pytest.mark.parametrize(
    ("setting", "value", "accepted"),
    [
        ("checks", "yes please", r"True, False or 'numerics'"),
        ("checks", 1, r"True, False or 'numerics'"),
        ("numerics", "on", r"True or False"),
        ("numerics", None, r"True or False"),
        ("debug", "2", r"an int level"),
        ("debug", True, r"an int level"),
        ("cpu_libraries", 3, r"a library set name"),
    ],
)
def test_a_value_of_the_wrong_kind_names_setting_value_and_accepted(setting, value, accepted):
    before = config.get()
    with (
        pytest.raises(ConfigError, match=rf"{setting}: expected {accepted}.*got {value!r}"),
        config.override(**{setting: value}),
    ):
        pass
    assert config.get() is before


def test_an_unknown_setting_names_the_close_match():
    with (
        pytest.raises(ConfigError, match=r"unknown setting 'chekcs'\. Did you mean 'checks'"),
        config.override(chekcs=True),
    ):
        pass


@pytest.mark.parametrize(
    ("raw", "checks", "numerics"),
    [
        ("1", True, False),
        ("0", False, False),
        ("false", False, False),
        ("numerics", True, True),
        ("1,numerics", True, True),
        ("", False, False),
    ],
)
def test_fnnc_checks_from_the_environment(monkeypatch, raw, checks, numerics):
    monkeypatch.setenv("FNNC_CHECKS", raw)
    cfg = config._from_env()
    assert (cfg.checks, cfg.numerics) == (checks, numerics)


def test_a_wrong_environment_value_is_a_config_error(monkeypatch):
    monkeypatch.setenv("FNNC_CHECKS", "yes please")
    with pytest.raises(ConfigError, match=r"FNNC_CHECKS='yes please'.*'numerics'"):
        config._from_env()
    monkeypatch.setenv("FNNC_CHECKS", "1")
    monkeypatch.setenv("FNNC_DEBUG", "loud")
    with pytest.raises(ConfigError, match=r"FNNC_DEBUG='loud': expected an int"):
        config._from_env()
