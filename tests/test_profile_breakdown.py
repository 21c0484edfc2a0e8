"""benchmarks/_profile.py: kernel times from a real JAX profile, sorted into kinds, and
the report that sets implementations side by side (what ``lm_step.py --profile`` prints)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import _profile


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "gemm"),
        ("aten::addmm", "gemm"),  # torch's CPU ops, by name
        ("aten::mm", "gemm"),
        ("fnnc_flash_attention_dkv", "attention"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "attention"),
        ("fnnc_softmax_crossentropy_backward", "cross-entropy"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel", "norm"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("transpose_copy_fusion.3", "copy/layout"),
        ("loop_add_fusion.12", "other fusions"),
    ],
)
def test_kernel_names_fall_under_their_kind(name, kind):
    assert _profile.kind_of(name) == kind


def test_a_jitted_steps_kernels_are_measured_per_step():
    step = jax.jit(lambda a: jnp.tanh(a @ a).sum())
    a = jnp.ones((128, 128))
    step(a).block_until_ready()
    one = _profile.jax_kernels(lambda: step(a), 1)
    three = _profile.jax_kernels(lambda: step(a), 3)
    assert one and three and all(ms >= 0 for ms in three.values())
    assert sum(three.values()) > 0
    # per step, not summed over the steps: three steps are not three times one step
    assert sum(three.values()) < 2.5 * sum(one.values()) + 0.5


def test_the_breakdown_sets_kinds_side_by_side_and_the_rest_is_launch_time():
    ours = {"fnnc_flash_attention": 2.0, "nvjet_gemm": 5.0, "loop_add_fusion": 1.0}
    theirs = {"flash_fwd_kernel": 1.5, "sm90_xmma_gemm": 5.5}
    report = _profile.breakdown([("ours", 9.0, ours), ("theirs", None, theirs), ("none", 1.0, {})])
    lines = report.splitlines()
    assert lines[0].split()[-2:] == ["ours", "theirs"]  # a run without kernels is left out
    row = {ln.split()[0]: ln.split()[-2:] for ln in lines[1:10]}
    assert row["attention"] == ["2.000", "1.500"]
    assert row["gemm"] == ["5.000", "5.500"]
    assert next(ln for ln in lines if ln.startswith("step - kernels")).split()[-2:] == [
        "1.000",
        "-",
    ]
    assert "ours: largest kernels, ms/step" in report
    assert lines.index("ours: largest kernels, ms/step") < lines.index(
        "theirs: largest kernels, ms/step"
    )


def test_kernels_past_the_kept_count_are_summed_not_dropped():
    totals = {f"k{i}": 1.0 for i in range(_profile.KEPT + 5)}
    kept = _profile._kept(totals, steps=2)
    assert len(kept) == _profile.KEPT + 1 and kept["(rest)"] == 2.5
    assert sum(kept.values()) == pytest.approx(sum(totals.values()) / 2)


def test_a_trace_sample_names_planes_lines_events_and_the_hlo(tmp_path):
    from fnnc.graph.profile import trace_runs

    step = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    x = jnp.ones((64, 64))
    step(x).block_until_ready()
    trace_runs(lambda: step(x), 2, str(tmp_path))
    hlo = step.lower(x).compile().as_text()
    sample = _profile.trace_sample(str(tmp_path), hlo)
    assert "plane /host:CPU: lines [" in sample
    assert " | " in sample  # an event with its stats
    assert "hlo: HloModule jit_" in sample
    assert _profile.trace_sample(str(tmp_path / "none")).startswith("no trace under")
