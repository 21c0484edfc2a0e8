"""FSDP of a scanned Repeat splits each block's own axes, never the block axis.

The scan slices one block per iteration; a stack split along the block axis made XLA
gather the whole stack on every device (the ZeRO-3 saving lost: 13x the temporaries of
the unrolled model for a 4-block stack on 4 devices). In one subprocess on 4 virtual CPU
devices: "fsdp" on ("data": 4) and ``ShardingRules(fsdp=True)`` on ("data": 2,
"model": 2) train as one device does (1e-5, 3 steps), every stack and its momentum
hold a quarter of each block per device, and no all-gather of the compiled step makes
a whole stack.
"""

from __future__ import annotations

import textwrap

from tests.helpers import run_on_cpu_devices

SCRIPT = textwrap.dedent(
    """
    import re
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from fnnc.graph import ShardingRules
    from tests.models.test_pipeline_model import DOWN, UP, trained
    assert jax.device_count() == 4, jax.devices()

    ref, ref_losses = trained()
    want = ref.parameters()
    cases = [((4,), ("data",), "fsdp", {UP: P(None, "data"), DOWN: P(None, "data")}),
             ((2, 2), ("data", "model"), ShardingRules(fsdp=True),
              {UP: P(None, "model", "data"), DOWN: P(None, "data", "model")})]
    for shape, names, sharding, specs in cases:
        where = str((shape, sharding))
        m, losses = trained(mesh=jax.make_mesh(shape, names), sharding=sharding)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=where)
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k + where)
        m.engine._sync_live()
        for pid, spec in specs.items():
            v = m.engine.values[pid]
            momentum = [a for a in jax.tree.leaves(m.engine.store.all_states(pid)) if a.ndim]
            assert len(momentum) == 1, (pid, momentum)
            for a in (v, momentum[0]):
                assert a.sharding.spec == spec, (pid, where, a.sharding.spec)
                for s in a.addressable_shards:  # all 4 blocks, a quarter of each
                    assert s.data.shape[0] == 4 and s.data.size * 4 == a.size, (pid, where)
        fit = next(p for key, p in m.engine._programs.items() if key[0] == "fit")
        hlo = fit.program.compiled_text()
        gathered = re.findall(r"= f32\\[([\\d,]+)\\]\\S* all-gather\\(", hlo)
        stacks = {",".join(map(str, m.engine.values[p].shape)) for p in specs}
        assert not stacks & set(gathered), (where, gathered)
        assert gathered, where  # FSDP gathers each block where it is used
    print("OK")
    """
)


def test_fsdp_splits_a_block_not_the_stack_and_trains_as_one_device():
    run_on_cpu_devices(SCRIPT)
