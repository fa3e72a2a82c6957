"""The DSL channel (bridges/channel.py) and the converter (bridges/converter.py): the posterior
mean's closed form, the SNR distributions, the token table's PCA initialisation, and the
converter's mask slot at initialisation."""

import torch

from geoprobe.bridges.channel import TokenTable, channel, endpoint_snr, lognormal_snr, mixed_snr, posterior_mean, random_order_snr
from geoprobe.bridges.converter import Converter


def test_posterior_mean_is_snr_free_only_on_the_unit_sphere():
    """Monte-Carlo E[x | z] under the channel at two SNRs equals the closed form; with non-unit
    norms the closed form (which drops the s|e|^2/2 term) is wrong."""
    g = torch.Generator().manual_seed(0)
    prior = torch.tensor([0.5, 0.3, 0.2])
    errors = {}
    for unit in (True, False):
        table = TokenTable(3, 2, generator=g)()
        if not unit:
            table = table * torch.tensor([[1.0], [2.0], [0.5]])
        for s in (0.7, 3.0):
            n = 400_000
            x = torch.multinomial(prior, n, replacement=True, generator=g)
            z = channel(table, x[None], torch.full((1, n), s), generator=g)[0]
            # condition on z near a probe point: E[e_x | z in the ball] vs the closed form there
            probe = s * table[0] * 0.6
            near = (z - probe).norm(dim=1) < 0.15 * max(1.0, s ** 0.5)
            empirical = table[x[near]].mean(0)
            closed = posterior_mean(probe[None], table, prior.log())[0]
            err = (empirical - closed).norm().item()
            errors[(unit, s)] = err
    assert errors[(True, 0.7)] < 0.05 and errors[(True, 3.0)] < 0.05, errors
    assert errors[(False, 0.7)] > 0.15 and errors[(False, 3.0)] > 0.05, errors  # 9-50x the unit-norm error


def test_converter_at_init_gives_the_mask_slot_one_half():
    converter = Converter(50)
    table = TokenTable(50, 8)()
    probs = converter(torch.zeros(2, 3, 8), table)
    assert probs.shape == (2, 3, 51)
    torch.testing.assert_close(probs[..., -1], torch.full((2, 3), 0.5))
    clean = converter(100.0 * table[:4][None], table)
    assert (clean[0, torch.arange(4), torch.arange(4)] > 0.99).all()


def test_snr_distributions():
    g = torch.Generator().manual_seed(0)
    s = lognormal_snr((2000, 8), generator=g)
    assert s.max() <= 40 and s.min() > 0
    assert abs(s.log().median().item() - 1.69) < 0.1
    r = random_order_snr((500, 20), generator=g)
    high = r >= 80
    assert ((r < 1) | high).all() and r.max() <= 100
    e = endpoint_snr((500, 20), generator=g)
    assert set(e.unique().tolist()) == {0.0, 100.0}
    m = mixed_snr((4000, 10), roar_frac=0.25, generator=g)
    roar_rows = ((m >= 80) | (m < 1)).all(1) & (m >= 80).any(1)
    assert 0.15 < roar_rows.float().mean() < 0.35


def test_pca_init_keeps_the_geometry_of_a_low_rank_embedding_table():
    g = torch.Generator().manual_seed(0)
    embeddings = torch.randn(40, 3, generator=g) @ torch.randn(3, 32, generator=g) + 5.0  # rank 3 + offset
    projected = TokenTable.pca_init(embeddings, 3)
    centred = embeddings - embeddings.mean(0)
    torch.testing.assert_close(projected @ projected.T, centred @ centred.T, rtol=1e-3, atol=1e-3)
    table = TokenTable(40, 3, init=projected)()
    torch.testing.assert_close(table.norm(dim=1), torch.ones(40))
