"""Audit 12 (issD): issue 11's registry of backends, checked where a backend is registered.

A backend whose platforms were spelt as JAX or a user spells them (``"CPU"``,
``"cuda"``) was registered and then never chosen, silently; a priority or ``supports``
of the wrong kind failed with Python's bare ``TypeError`` at the first eager call of the
command. ``register_backend`` now spells the platforms as fnnc does and refuses the rest
with a :class:`~fnnc.errors.BackendError` naming the command, the backend and the field.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.dispatch import use_measured_defaults, why_not
from fnnc.errors import BackendError, CommandError

X = np.array([-1.0, 2.0], np.float32)
SPECS = [jax.ShapeDtypeStruct((2,), jnp.float32)]


def _plus_100(x):
    return jnp.maximum(x, 0) + 100.0


@pytest.fixture
def fake():
    """Registers nothing itself; removes the backend 'fake' of relu after the test."""
    yield
    ops.unregister_backend("relu", "fake")


@pytest.mark.parametrize(
    "platforms, chosen_on",
    [(("CPU",), "cpu"), ("cpu", "cpu"), (["cpu"], "cpu"), (("cuda",), "gpu"), (("ROCm",), "gpu")],
)
def test_platform_names_are_spelt_as_fnnc_spells_them(fake, platforms, chosen_on):
    ops.register_backend("relu", ops.Backend("fake", _plus_100, platforms, priority=5))
    assert ops.select_backend(ops.relu(), SPECS, chosen_on) == "fake"
    assert ops.backends_of("relu")["fake"].platforms == (chosen_on,)
    if chosen_on == jax.default_backend():  # the eager call runs it: the fake's numbers
        np.testing.assert_array_equal(ops.relu()(X), np.maximum(X, 0) + 100.0)


def test_a_backend_given_fnnc_names_is_registered_as_given(fake):
    backend = ops.Backend("fake", _plus_100, ("cpu", "gpu"), priority=5)
    ops.register_backend("relu", backend)
    assert ops.backends_of("relu")["fake"] is backend


@pytest.mark.parametrize(
    "fields, said",
    [
        (dict(platforms=("metal9",)), "'metal9' is no platform"),
        (dict(platforms={"cpu"}), "platforms must be a tuple"),
        (dict(interpret_platforms=("cpus",)), "interpret_platforms=('cpus',)"),
        (dict(priority="5"), "priority must be an int, got '5'"),
        (dict(priority=True), "priority must be an int, got True"),
        (dict(supports=5), "supports must be a function, got int"),
        (dict(backward="grad"), "backward must be a function, got str"),
        (dict(forward=None), "forward must be a function"),
    ],
)
def test_a_malformed_backend_is_refused_when_registered(fields, said):
    given = dict(name="fake", forward=_plus_100, platforms=("cpu",), priority=5) | fields
    with pytest.raises(BackendError, match="register_backend\\('relu', Backend\\('fake'") as e:
        ops.register_backend("relu", ops.Backend(**given))
    assert said in str(e.value)
    assert "fake" not in ops.backends_of("relu")  # nothing half-registered
    np.testing.assert_array_equal(ops.relu()(X), np.maximum(X, 0))


def test_registering_a_function_instead_of_a_backend_says_what_to_pass():
    with pytest.raises(BackendError, match=r"expected a fnnc\.ops\.Backend"):
        ops.register_backend("relu", _plus_100)


def _small_only(cmd, specs):  # a predicate, not fnnc's None-or-reason
    return specs[0].shape[0] <= 4


@pytest.mark.parametrize("rows", [2, 8])
def test_a_supports_returning_a_bool_is_an_error_not_a_backend_never_chosen(fake, rows):
    """``supports`` returning True (meant: runs) was read as a reason, so the backend was
    never chosen; False (meant: declines) let ``autotune`` time it on those inputs."""
    ops.register_backend(
        "relu", ops.Backend("fake", _plus_100, ("cpu",), supports=_small_only, priority=5)
    )
    specs = [jax.ShapeDtypeStruct((rows,), jnp.float32)]
    said = f"supports\\(cmd, specs\\) returned {rows <= 4}"
    with pytest.raises(BackendError, match=f"backend 'fake' of relu: {said}"):
        ops.select_backend(ops.relu(), specs, "cpu")
    with pytest.raises(BackendError, match=said):
        ops.autotune(ops.relu(), np.ones((rows,), np.float32), repeats=1, platform="cpu")


def test_a_supports_saying_none_or_why_is_followed(fake):
    def small_only(cmd, specs):
        return None if specs[0].shape[0] <= 4 else "more than 4 rows"

    ops.register_backend(
        "relu", ops.Backend("fake", _plus_100, ("cpu",), supports=small_only, priority=5)
    )
    small, large = ([jax.ShapeDtypeStruct((n,), jnp.float32)] for n in (2, 8))
    assert ops.select_backend(ops.relu(), small, "cpu") == "fake"
    assert ops.select_backend(ops.relu(), large, "cpu") == "xla"
    assert why_not(ops.backends_of("relu")["fake"], ops.relu(), large, "cpu") == (
        "more than 4 rows"
    )


@pytest.mark.parametrize(
    "devices, said",
    [
        ({"cpu": {"relu": "fake"}}, "device 'cpu': command 'relu' maps to a str"),
        ({"cpu": ["relu"]}, "device 'cpu': got a list"),
        (["cpu"], "got a list"),
        (
            {"cpu": {"relu": {"*": 5}}},
            "device 'cpu': command 'relu', class '\\*': backend 5 is no name",
        ),
    ],
)
def test_malformed_measured_defaults_are_refused_when_given(fake, devices, said):
    """They were kept, and the next backend choice died with a bare AttributeError."""
    from fnnc.core import measured

    ops.register_backend("relu", ops.Backend("fake", _plus_100, ("cpu",), priority=0))
    kind = measured.device_kind("cpu")
    devices = {kind: v for v in devices.values()} if isinstance(devices, dict) else devices
    with pytest.raises(BackendError, match=f"use_measured_defaults: {said}"):
        use_measured_defaults(devices)
    assert ops.select_backend(ops.relu(), SPECS, "cpu") == "xla"  # the shipped table stays
    use_measured_defaults({kind: {"relu": {"*": "fake"}}})
    try:
        assert ops.select_backend(ops.relu(), SPECS, "cpu") == "fake"
    finally:
        use_measured_defaults(None)
    assert ops.select_backend(ops.relu(), SPECS, "cpu") == "xla"


def _same(a):
    return a


@pytest.mark.parametrize(
    "given, said",
    [
        (dict(elementwise="no"), "elementwise must be True or False, got 'no'"),
        (dict(idempotent="x"), "idempotent must be True or False or a function"),
        (dict(commutative=1), "commutative must be True or False or a function"),
        (dict(random=None), "random must be True or False, got None"),
        (dict(uses=(0,)), "uses must be a fnnc.ops.Uses"),
        (dict(min_inputs="1"), "min_inputs must be an int >= 0 or None, got '1'"),
        (dict(family=None), "family must be a non-empty string"),
        (dict(shape=5), "shape must be the shape rule, a function, got int"),
    ],
)
def test_defcommand_refuses_attributes_the_passes_would_misread(given, said):
    """``elementwise="no"`` was kept and read as true: ``fuse`` chained the command."""
    args = dict(family="elementwise", shape=_same) | given
    with pytest.raises(CommandError, match="defcommand of 'audit12_bad'") as e:
        ops.defcommand(name="audit12_bad", **args)(lambda a: a * 2.0)
    assert said in str(e.value)
    assert "audit12_bad" not in ops.registry()


def test_defcommand_takes_flags_and_predicates(restore_registries):
    @ops.defcommand(
        family="elementwise",
        shape=lambda a, b: a,
        elementwise=np.bool_(True),
        commutative=lambda cmd: True,
        name="audit12_good",
    )
    def twice(a, b):
        """a + b (test command)."""
        return a + b

    attributes = ops.lookup("audit12_good").attributes
    assert attributes.elementwise and attributes.is_commutative(twice())
    np.testing.assert_array_equal(twice()(X, X), X + X)
