"""The PyTorch implementations of ``benchmarks/lm_step.py`` (``torch``,
``torch-compile``). torch is optional (never a dependency of fnnc): it is imported only
inside :func:`run_torch`."""

from __future__ import annotations

import time

import numpy as np

from benchmarks import _profile
from benchmarks._lm_common import EPS, LR, Result, Size, _profiled, pid


def run_torch(
    z: Size, data, params, compiled: bool, precision: str, timed: bool, profile: int = 0
) -> Result:
    """Autocast bfloat16, SDPA, fused Adam; the model under ``torch.compile`` if asked."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    dev = "cuda" if torch.cuda.is_available() else "cpu"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = z.width
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in "qkvo")
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, h):
            b, s, d = h.shape
            a = self.ln1(h)
            q, k, v = (
                p(a).view(b, s, z.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v)
            )
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.o(o.transpose(1, 2).reshape(b, s, d))
            return h + self.down(torch.relu(self.up(self.ln2(h))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(z.vocab, z.width)
            self.positions = nn.Parameter(torch.zeros(z.seq, z.width))
            self.blocks = nn.ModuleList(Block() for _ in range(z.blocks))
            self.ln_out, self.logits = nn.LayerNorm(z.width, eps=1e-5), nn.Linear(z.width, z.vocab)

        def forward(self, tokens):
            h = self.embed(tokens) + self.positions
            for block in self.blocks:
                h = block(h)
            return self.logits(self.ln_out(h))

    model = LM()
    with torch.no_grad():  # fnnc's weights; torch's Linear has fnnc's [out, in] layout
        t = lambda name, i: torch.from_numpy(np.array(params[pid(name, i)]))
        pairs = [(model.embed.weight, ("embed", 0)), (model.positions, ("positions", 0))]
        for i, blk in enumerate(model.blocks):
            for j, p in enumerate((blk.q, blk.k, blk.v, blk.o)):
                pairs += [(p.weight, (f"attn{i}", j)), (p.bias, (f"attn{i}", 4 + j))]
            for p, name in ((blk.ln1, f"ln{i}a"), (blk.ln2, f"ln{i}b"), (blk.up, f"mlp{i}a"),
                            (blk.down, f"mlp{i}b")):  # fmt: skip
                pairs += [(p.weight, (name, 0)), (p.bias, (name, 1))]
        for p, name in ((model.ln_out, "ln_out"), (model.logits, "logits")):
            pairs += [(p.weight, (name, 0)), (p.bias, (name, 1))]
        for param, key in pairs:
            param.copy_(t(*key))
    model = model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS, fused=dev == "cuda")
    low = precision == "bfloat16"

    def loss_of(x, y):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=low):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, z.vocab), y.reshape(-1))

    # the loss under torch.compile too, as a torch user compiles a step: Inductor then
    # fuses the float32 upcast into the cross-entropy. (Until 2026-11-27 only the model
    # was compiled, and the eager float32 cross-entropy cost torch 5.6 ms of copies and
    # softmax kernels a step on an H100: a weaker baseline than torch.compile is.)
    loss_fn = torch.compile(loss_of) if compiled else loss_of

    def fit(x, y):
        loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    tensors = [
        (torch.from_numpy(a).long().to(dev), torch.from_numpy(b).long().to(dev)) for a, b in data
    ]
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = [float(fit(x, y)) for x, y in tensors]
    ms = None
    if timed:
        x, y = tensors[0]
        samples = []
        for _ in range(5):
            sync()
            start = time.perf_counter()
            for _ in range(5):
                fit(x, y)
            sync()
            samples.append((time.perf_counter() - start) / 5)
        ms = 1e3 * float(np.median(samples))
    peak = int(torch.cuda.max_memory_allocated()) if dev == "cuda" else None
    name = "torch-compile" if compiled else "torch"
    kind = torch.cuda.get_device_name() if dev == "cuda" else ""
    x, y = tensors[0]
    result = Result(name, ms, peak, "device" if peak else "", losses, device=kind)
    return _profiled(
        result, profile, lambda: _profile.torch_kernels(lambda: fit(x, y), profile, sync)
    )
