"""The diffusion bridge (sigma_b > 0): its sampler against the exact conditional of a
linear-Gaussian model, its validation objective (deterministic, the training loss on a tau grid),
and what a stochastic bridge records and how it counts as learned."""

import pytest
import torch

from geoprobe.bridges.channel import channel
from geoprobe.bridges.fit import (draw_conditions, fit_bridge, fit_statistics, grid_objective, grid_objectives,
                                  positions_weight, untrained_objective, validate)
from geoprobe.bridges.hidden import REGRESSION, BridgeConfig, HiddenBridge, Teacher, bridge_path_sample
from geoprobe.bridges.train import TrainConfig
from geoprobe.corpus import iter_blocks, read_documents


def gaussian(d=3, seed=0):
    """h ~ N(mu, Sigma) given the condition, the path starting at s: mu, Sigma, s and the exact
    posterior mean E[h | y_tau] of the bridge y_tau = (1 - tau) s + tau h + sigma sqrt(tau (1 - tau)) eps."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    sigma_h = a @ a.T / d + 0.2 * torch.eye(d, dtype=torch.float64)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    s = torch.randn(d, generator=g, dtype=torch.float64)

    def exact(sigma_b):
        def predict(y, tau):
            out = torch.empty_like(y)
            for value in tau.unique():  # the gain is the same for every row at one tau
                t = float(value)
                rows = tau == value
                # Cov(h, y) Var(y)^-1 = t Sigma (t^2 Sigma + sigma^2 t (1 - t) I)^-1 = Sigma (t Sigma + sigma^2 (1 - t) I)^-1
                gain = sigma_h @ torch.linalg.inv(t * sigma_h + sigma_b ** 2 * (1 - t) * torch.eye(d, dtype=y.dtype))
                out[rows] = mu + (y[rows] - (1 - t) * s - t * mu) @ gain.T
            return out
        return predict

    return mu, sigma_h, s, exact


@pytest.mark.parametrize("sigma_b", [0.5, 1.0, 2.0])
def test_the_k_step_sampler_draws_the_exact_conditional_of_a_linear_gaussian_model(sigma_b):
    """With the exact posterior mean as its network, K steps of the bridge's sampler give samples
    whose mean is the conditional mean (exact at any K, by the tower rule) and whose covariance
    tends to the conditional covariance as K grows (each step leaves out Var(h | y_tau) times the
    square of its step's gain: O(1/K) in all). Tolerances: the mean within 4 standard errors per
    channel; the covariance within 6 % (Frobenius, relative) at K = 200 from 40,000 samples (the
    sampling error alone is about 1 %)."""
    mu, sigma_h, s, exact = gaussian()
    n = 40_000
    g = torch.Generator().manual_seed(1)
    for steps in (4, 200):
        h = bridge_path_sample(exact(sigma_b), s.expand(n, -1).clone(), steps, sigma_b, g)
        assert (h.mean(0) - mu).abs().le(4 * (sigma_h.diagonal() / n).sqrt()).all(), (steps, h.mean(0), mu)
        if steps == 200:
            cov = torch.cov(h.T)
            assert torch.linalg.norm(cov - sigma_h) / torch.linalg.norm(sigma_h) < 0.06, (cov, sigma_h)
    # and a few steps are not enough: the covariance falls short (so the check above can fail)
    few = torch.cov(bridge_path_sample(exact(sigma_b), s.expand(n, -1).clone(), 2, sigma_b, g).T)
    assert torch.linalg.norm(few - sigma_h) / torch.linalg.norm(sigma_h) > 0.06


def test_with_sigma_b_zero_the_sampler_is_the_regression():
    """sigma_b = 0: y_tau determines h for tau > 0, so the exact network returns it and every K
    gives the regression E[h | condition] = mu exactly, with no spread."""
    mu, _, s, _ = gaussian()

    def predict(y, tau):
        t = tau[:, None]
        return torch.where(t == 0, mu.expand_as(y), (y - (1 - t) * s) / t.clamp(min=1e-12))

    for steps in (1, 3, 16):
        h = bridge_path_sample(predict, s.expand(5, -1).clone(), steps, 0.0)
        assert torch.allclose(h, mu.expand(5, -1), atol=1e-10)


@pytest.fixture(scope="module")
def states(llama, corpus_txt):
    from geoprobe.bridges.states import teacher_states

    docs = read_documents(str(corpus_txt))
    blocks = list(iter_blocks(docs, llama.tokenizer, 32, seed=0))
    return teacher_states(llama, blocks[:-8], blocks[-8:-4], blocks[-4:], [2])


def small(llama, **kw):
    return BridgeConfig(layer=2, vocab_size=llama.config.vocab_size, hidden_size=llama.hidden_size,
                        d_model=64, n_layers=1, n_heads=4, **kw)


def trained_looking(llama, states, **kw):
    """A bridge with its statistics fitted and a non-zero output layer (its update starts at 0)."""
    bridge = HiddenBridge(small(llama, **kw), seed=3).eval()
    fit_statistics(bridge, states)
    with torch.no_grad():
        # its own generator: the global one's state depends on which tests ran before on this worker
        torch.nn.init.normal_(bridge.out.weight, std=0.05, generator=torch.Generator().manual_seed(0))
    return bridge


def test_the_validation_objective_is_deterministic_for_fixed_weights(llama, states):
    bridge = trained_looking(llama, states)
    teacher = Teacher(llama, 2)
    first = grid_objective(bridge, teacher, states.stop, 2)
    torch.rand(1000)  # the global generator moved, and a validation ran in between
    validate(bridge, teacher, states.val, 2)
    assert grid_objective(bridge, teacher, states.stop, 2) == first
    assert grid_objective(bridge, teacher, states.stop, 2, seed=1) != first  # the draws do matter


def test_the_validation_objective_of_clean_tau_zero_rows_is_their_plain_loss(llama, states):
    """With every row the plain regression (clean condition, tau = 0) nothing is left to draw: the
    grid objective is the position-weighted loss of the clean source at tau = 0, computed here by
    `loss` on the one-hot source."""
    bridge = trained_looking(llama, states, **{**REGRESSION, "regression_frac": 1.0})
    teacher = Teacher(llama, 2)
    total = count = 0.0
    with torch.no_grad():
        parts = list(states.stop.fixed(3, (2,), 0, "cpu"))
    for ids, mask, got in parts:
        clean = torch.ones(len(ids), dtype=torch.bool)
        a = bridge.source(torch.zeros(*ids.shape, bridge.cfg.d_tok), teacher.embeddings, teacher.offsets(ids.shape[1]),
                          ids, clean)
        weight = bridge.scored(got[2], positions_weight(mask))
        total += float(bridge.loss(a, got[2], weight, tau=torch.zeros(len(ids))).detach() * weight.sum())
        count += float(weight.sum())
    assert grid_objective(bridge, teacher, states.stop, 3) == pytest.approx(total / count, rel=1e-5)


def test_the_objectives_posterior_mean_part_is_its_loss_with_every_tau_at_zero(llama, states):
    """objective_tau0 (amendment 14: the objective less it is what the diffusion objective adds
    beyond a regression's loss) is computed in grid_objective's pass without moving its draws: the
    objective keeps its bits, and objective_tau0 is, computed here directly, the loss at tau = 0
    (no bridge noise) under the conditions grid_objective draws for each batch. A regression's
    rows are all at tau = 0, so there the two numbers are one."""
    bridge, teacher = trained_looking(llama, states, sigma_b=1.0, bridge_steps=4), Teacher(llama, 2)
    both = grid_objectives(bridge, teacher, states.stop, 2)
    assert both["objective"] == grid_objective(bridge, teacher, states.stop, 2)
    total = count = 0.0
    with torch.no_grad():
        for index, (ids, mask, got) in enumerate(states.stop.fixed(2, (2,), 0, "cpu")):
            draws = draw_conditions(bridge.cfg, *ids.shape, torch.Generator().manual_seed(index))  # seed 0's
            z = channel(bridge.table(), ids, draws["snr"], noise=draws["noise"])
            a = bridge.source(z, teacher.embeddings, teacher.offsets(ids.shape[1]), ids, draws["clean"])
            weight = bridge.scored(got[2], positions_weight(mask))
            loss = bridge.loss(a, got[2], weight, tau=torch.zeros(len(ids)), eps=torch.zeros_like(got[2]))
            total += float(loss) * float(weight.sum())
            count += float(weight.sum())
    assert both["objective_tau0"] == pytest.approx(total / count, rel=1e-5)
    # tau > 0 does change it: by far more than float32 rounding (2.7e-4 of it on this untrained bridge)
    assert abs(both["objective_tau0"] - both["objective"]) > 1e-5 * both["objective"]
    regression = grid_objectives(trained_looking(llama, states, **REGRESSION), teacher, states.stop, 2)
    assert regression["objective_tau0"] == regression["objective"]


def test_the_lookups_own_objective_is_the_untrained_bridges(llama, states):
    """The untrained bridge's update is zero, so it predicts its carry, the token lookup's row, at
    every tau: with every row at clean condition its objective is, computed here from the lookup
    table directly, the lookup's error in the bridge's standardised units. A bridge whose update is
    no longer zero is refused, and one that does not start at the lookup has no such number."""
    bridge, teacher = HiddenBridge(small(llama, sigma_b=1.0, bridge_steps=4, clean_frac=1.0), seed=3), Teacher(llama, 2)
    fit_statistics(bridge, states)
    total = count = 0.0
    for ids, mask, got in states.val.fixed(2, (2,), 0, "cpu"):
        table = bridge.lookup[bridge.lookup_slots(ids)]
        err = (((table - got[2]) / bridge.target_scale) ** 2).mean(-1)
        weight = bridge.scored(got[2], positions_weight(mask))
        total += float((err * weight).sum())
        count += float(weight.sum())
    assert untrained_objective(bridge, teacher, states.val, 2) == pytest.approx(total / count, rel=1e-5)
    with pytest.raises(ValueError, match="update is still zero"):
        untrained_objective(trained_looking(llama, states, sigma_b=1.0, bridge_steps=4), teacher, states.val, 2)
    assert untrained_objective(HiddenBridge(small(llama, carry="channel")), teacher, states.val, 2) is None


def test_a_diffusion_bridge_records_its_samples_spread_and_is_judged_by_its_posterior_mean(llama, states, tmp_path):
    """A stochastic bridge: its plateau rule watches the grid objective (the stopping curve's last
    point is that objective of the kept weights), metrics.json has the samples' CRPS, and whether
    it beats the lookup is read from its posterior mean (tau = 0), not from a sample."""
    controls = {"control_lookup_nmse_dim": 10.0, "control_lookup_ridge_nmse_dim": 10.0}
    train = TrainConfig(steps=6, batch_size=4, save_every=6, eval_every=3, eval_at_start=True, schedule="constant",
                        warmup=1)
    metrics = fit_bridge(llama, 2, states, cfg=small(llama, bridge_steps=4), train_cfg=train, out=tmp_path / "b",
                         identity={"layer": 2}, controls=controls)
    assert metrics["bridge_kind"] == "diffusion"
    assert metrics["crps_dim"] > 0 and metrics["nmse_dim"] > metrics["nmse_dim_1step"] * 0.5
    assert metrics["beats_lookup"] is True  # 10 is far above any nmse_dim here
    from geoprobe.bridges.hidden import load_bridge

    bridge, _ = load_bridge(tmp_path / "b")
    best = dict(map(tuple, metrics["val_curve"]))[metrics["best_step"]]
    assert grid_objective(bridge, Teacher(llama, 2), states.stop, 4) == pytest.approx(best, rel=1e-6)
    # the lookup's own objective: that of the same bridge untrained (its seed's weights, its statistics)
    fresh = HiddenBridge(bridge.cfg, seed=train.seed)
    fresh.set_support(bridge.support)
    fit_statistics(fresh, states)
    assert metrics["control_lookup_objective"] == grid_objective(fresh, Teacher(llama, 2), states.val, 4)
    assert metrics["objective_tau0"] == grid_objectives(bridge, Teacher(llama, 2), states.val, 4)["objective_tau0"]
    # its guard: the posterior mean's nmse_dim on the stopping split at every check, as validate computes it
    guard = dict(map(tuple, metrics["guard_curve"]))
    assert list(guard) == [s for s, _ in metrics["val_curve"]]
    assert guard[metrics["best_step"]] == pytest.approx(
        validate(bridge, Teacher(llama, 2), states.stop, 4, full=False, steps=1)["nmse_dim"], rel=1e-6)
    regression = fit_bridge(llama, 2, states, cfg=small(llama, **REGRESSION), train_cfg=train, out=tmp_path / "r",
                            identity={"layer": 2})
    assert regression["bridge_kind"] == "regression" and "crps_dim" not in regression
    assert "guard_curve" not in regression


def test_the_noisy_sample_scores_judge_the_spread_where_the_posterior_has_one(llama, states):
    """sample_scores(noisy=True) keeps the clean scores as they are (its draws are apart) and adds
    crps_dim at each condition SNR; a sampler without spread (sigma_b 0: every sample the same)
    scores its mean absolute error there, a proper score's worst case for that mean, so the noisy
    CRPS of a bridge whose samples spread is not the collapsed one's."""
    from geoprobe.bridges.fit import NOISY_SNRS, sample_scores

    bridge, teacher = trained_looking(llama, states, sigma_b=1.0, bridge_steps=4), Teacher(llama, 2)
    clean = sample_scores(bridge, teacher, states.val, 2, 4)
    both = sample_scores(bridge, teacher, states.val, 2, 4, noisy=True)
    assert {k: both[k] for k in clean} == clean and set(both["crps_dim_by_snr"]) == {str(s) for s in NOISY_SNRS}
    assert both["crps_dim_noisy"] == pytest.approx(sum(both["crps_dim_by_snr"].values()) / len(NOISY_SNRS))
    assert sample_scores(bridge, teacher, states.val, 2, 4, noisy=True) == both  # a fixed seed
    collapsed = trained_looking(llama, states, sigma_b=0.0, bridge_steps=4)
    scores = sample_scores(collapsed, teacher, states.val, 2, 4, noisy=True)
    assert all(v > 0 for v in scores["crps_dim_by_snr"].values()) and scores["crps_dim_noisy"] != both["crps_dim_noisy"]
