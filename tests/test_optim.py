"""The trainer's AdamW: fused where torch has it, and the same updates as the plain one."""

from __future__ import annotations

import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.optim import fastest_adamw_kwargs, make_optimizer


def _params(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(7, 5, generator=gen)), torch.nn.Parameter(torch.randn(5, generator=gen))]


def test_fused_adamw_on_cpu():
    assert fastest_adamw_kwargs(_params(0)) == {"fused": True}
    optimizer, _ = make_optimizer(_params(0), GRPOConfig())
    assert optimizer.defaults["fused"] is True


def test_fast_adamw_updates_like_the_plain_one():
    config = GRPOConfig(learning_rate=1e-2, weight_decay=0.1, warmup_steps=3)
    fast, plain = _params(1), _params(1)
    opt_fast, sched_fast = make_optimizer(fast, config)
    opt_plain = torch.optim.AdamW(plain, lr=config.learning_rate, weight_decay=config.weight_decay, foreach=False, fused=False)
    sched_plain = torch.optim.lr_scheduler.LambdaLR(opt_plain, lambda u: min(1.0, (u + 1) / 4))
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        grads = [torch.randn(p.shape, generator=gen) for p in fast]
        for params, opt, sched in ((fast, opt_fast, sched_fast), (plain, opt_plain, sched_plain)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
            sched.step()
    moved = max(float((a - b).abs().max()) for a, b in zip(fast, _params(1)))
    assert moved > 0.05  # the parameters really moved ...
    for a, b in zip(fast, plain):  # ... and both optimizers moved them the same way
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
