"""bfloat16 weights trained with stochastic rounding (bridges/optim.py), against torch's own
AdamW in float32 and against plain rounding, which loses small updates."""

import torch

from geoprobe.bridges.optim import StochasticAdamW, round_stochastic, step_generator, update_ema


def neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two bfloat16 values around each float32 value (by truncation and one ulp further)."""
    down = (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
    up = ((x.view(torch.int32) & ~0xFFFF) + 0x10000).view(torch.float32)
    return down, up


def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50, generator=g) * 10 ** torch.randint(-3, 4, (50,), generator=g),
                   -torch.rand(50, generator=g), torch.tensor([0.0, 1.0, -2.5, 1 + 2 ** -10, -(1 + 3 * 2 ** -10)])])
    draws = torch.stack([round_stochastic(x, g).float() for _ in range(4000)])
    down, up = neighbours(x)
    assert ((draws == down) | (draws == up)).all()
    exact = x.to(torch.bfloat16).float() == x
    assert (draws[:, exact] == x[exact]).all()  # a representable value is never moved
    # the mean is x within four standard errors of a two-point draw (where x is not representable:
    # a representable x, zero included, is checked above, and its neighbours around zero are
    # bfloat16 subnormals, which the CPU flushes to zero: geoprobe.device.flush_denormals)
    p = (x - down) / (up - down)
    se = (up - down).abs() * (p * (1 - p)).clamp(min=1e-12).sqrt() / 4000 ** 0.5
    assert ((draws.mean(0) - x).abs() <= 4 * se + 1e-12)[~exact].all() and (~exact).sum() == 85
    # the value 1 + 2^-10 sits a quarter of the way from 1 to the next bfloat16 (1 + 2^-7... ulp 2^-7 at 1)
    assert abs((draws[:, -2] > 1).float().mean().item() - 2 ** -10 / 2 ** -7) < 0.03


def quadratic_problem(dtype):
    """Weights at 1 pulled towards 1.5: every AdamW step (about lr = 1e-4, the gradient's sign
    never changes) is far below half a bfloat16 unit at 1 (2^-8), so only unbiased rounding can
    move them; in 100 steps float32 moves them by about 0.01, 1.3 units."""
    w = torch.nn.Parameter(torch.ones(4096, dtype=dtype))
    target = torch.full((4096,), 1.5)
    return w, target


def run(optimizer, w, target, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        ((w.float() - target) ** 2).sum().backward()
        optimizer.step()
    return w.detach().float()


def test_float32_parameters_get_torch_adamw_exactly():
    g = torch.Generator().manual_seed(1)
    ours = [torch.nn.Parameter(torch.randn(7, 5, generator=g)), torch.nn.Parameter(torch.randn(5, generator=g))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    a = StochasticAdamW([{"params": ours[:1], "weight_decay": 0.1}, {"params": ours[1:], "weight_decay": 0.0}],
                        lr=1e-2, betas=(0.9, 0.95))
    b = torch.optim.AdamW([{"params": theirs[:1], "weight_decay": 0.1}, {"params": theirs[1:], "weight_decay": 0.0}],
                          lr=1e-2, betas=(0.9, 0.95), foreach=False)
    for step in range(20):
        data = torch.randn(3, 7, generator=g)
        for params, opt in ((ours, a), (theirs, b)):
            opt.zero_grad()
            ((data @ params[0] + params[1]) ** 2).mean().backward()
            opt.step()
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)


def test_bfloat16_weights_follow_float32_training_where_plain_rounding_stalls():
    steps = 100
    w32, target = quadratic_problem(torch.float32)
    reference = run(torch.optim.AdamW([w32], lr=1e-4, weight_decay=0.0), w32, target, steps)
    w, _ = quadratic_problem(torch.bfloat16)
    plain = run(torch.optim.AdamW([w], lr=1e-4, weight_decay=0.0, foreach=False), w, target, steps)
    w, _ = quadratic_problem(torch.bfloat16)
    stochastic = run(StochasticAdamW([w], lr=1e-4, weight_decay=0.0), w, target, steps)
    moved = float(reference.mean() - 1)
    assert 0.009 < moved < 0.011
    assert float(plain.mean() - 1) == 0  # every step rounds back to 1
    assert abs(float(stochastic.mean() - 1) - moved) < 0.1 * moved  # the mean over 4,096 weights tracks it


def test_a_bfloat16_ema_moves_in_expectation_and_float32_entries_exactly():
    live = {"w": torch.full((4096,), 1 + 2 ** -7, dtype=torch.bfloat16), "b": torch.ones(3)}
    ema = {"w": torch.ones(4096, dtype=torch.bfloat16), "b": torch.zeros(3)}
    for step in range(100):
        update_ema(ema, live, 1e-3, lambda device: step_generator(0, step, device, "ema"))
    expected = 1 + 2 ** -7 * (1 - (1 - 1e-3) ** 100)  # 9.5% of one unit: plain rounding stays at 1
    assert abs(ema["w"].float().mean().item() - expected) < 0.15 * (expected - 1)
    torch.testing.assert_close(ema["b"], torch.full((3,), 1 - (1 - 1e-3) ** 100))


def test_the_rounding_bits_are_fixed_by_seed_and_step():
    x = torch.rand(1000) + 1
    again = [round_stochastic(x, step_generator(3, 7, x.device)) for _ in range(2)]
    assert torch.equal(again[0], again[1])
    assert not torch.equal(again[0], round_stochastic(x, step_generator(3, 8, x.device)))
    assert not torch.equal(round_stochastic(x, step_generator(3, 7, x.device, "ema")), again[0])
