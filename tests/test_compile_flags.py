"""The suite's compile flags (tests/compile_flags.py): probed, kept only where XLA takes
them, passed on to children, and left out on request; a program compiled with them
computes what it computes under XLA's defaults."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tests import compile_flags
from tests.helpers import subprocess_env


def test_a_flag_xla_does_not_know_is_dropped_and_the_others_kept(monkeypatch):
    monkeypatch.setattr(compile_flags, "CPU_ONLY", ("--xla_no_such_flag_here=1",))
    env = {**subprocess_env(), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env.pop(compile_flags.ADDED, None)
    env.pop(compile_flags.DEFAULTS, None)
    added = compile_flags.apply(env)
    assert added == compile_flags.OPT_LEVEL  # JAX_PLATFORMS=cpu: the level applies
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {added}"
    assert env[compile_flags.ADDED] == added
    assert compile_flags.apply(env) == added  # once per process tree: no second probe


def test_defaults_on_request_and_flags_already_set_are_not_added_twice():
    env = {**subprocess_env(), compile_flags.DEFAULTS: "1", "XLA_FLAGS": ""}
    env.pop(compile_flags.ADDED, None)
    assert compile_flags.apply(env) == "" and env["XLA_FLAGS"] == ""
    env = {**subprocess_env(), "XLA_FLAGS": f"{compile_flags.OPT_LEVEL[:-1]}2"}
    env.pop(compile_flags.ADDED, None)
    env.pop(compile_flags.DEFAULTS, None)
    added = compile_flags.apply(env)
    assert compile_flags.OPT_LEVEL not in added  # the user's level stays the only one
    assert env["XLA_FLAGS"].split()[0] == f"{compile_flags.OPT_LEVEL[:-1]}2"


def test_a_child_that_sets_its_own_flags_keeps_the_suites():
    child = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=3")
    assert child["XLA_FLAGS"].endswith("--xla_force_host_platform_device_count=3")
    assert child["XLA_FLAGS"].startswith(compile_flags.merged(""))


PROGRAM = """
import sys, numpy as np, jax, jax.numpy as jnp
x = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((24, 24)).astype(np.float32) / 5
def loss(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jax.nn.log_softmax(h @ w) * jax.nn.softmax(h)) + jnp.mean(jnp.exp(h) ** 2)
out = jax.jit(jax.value_and_grad(loss))(w, x)
np.save(sys.argv[1], np.concatenate([np.ravel(out[0]), np.ravel(out[1])]))
"""


def test_a_program_computes_under_the_flags_what_it_does_under_xlas_defaults(tmp_path):
    results = []
    for name, flags in (("defaults", ""), ("suite", compile_flags.merged(""))):
        path = tmp_path / f"{name}.npy"
        env = {**subprocess_env(), "XLA_FLAGS": flags, compile_flags.ADDED: flags}
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, str(path)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results.append(np.load(path))
    # the same operations in the same order of float32 rounding, up to a few ULPs where
    # the two emitters' tanh and exp approximations differ
    np.testing.assert_allclose(results[1], results[0], rtol=2e-6, atol=1e-6)
