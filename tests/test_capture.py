"""Hooks equal output_hidden_states; early stop; padding; position selection."""

import pytest
import torch

from geoprobe.backbone import load_backbone
from geoprobe.capture import capture, select_positions


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_hooks_equal_output_hidden_states(arch, tiny_models):
    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    ids = torch.randint(5, 300, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = backbone.model(input_ids=ids, output_hidden_states=True).hidden_states
    n = backbone.num_layers
    ours = capture(backbone, ids, layers=range(n + 1))
    assert sorted(ours) == list(range(n + 1))
    for layer in range(n):
        torch.testing.assert_close(ours[layer], reference[layer], rtol=0, atol=0)
    # transformers' last entry has the final norm applied; ours is the raw residual stream.
    assert not torch.allclose(ours[n], reference[n], atol=1e-3)
    torch.testing.assert_close(backbone.final_norm(ours[n]), reference[n], rtol=1e-6, atol=1e-6)


def test_capture_stops_after_the_deepest_requested_layer(tiny_models):
    backbone = load_backbone(str(tiny_models("llama")), device="cpu")
    ran = []
    handles = [b.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, b in enumerate(backbone.blocks)]
    head = backbone.lm_head.register_forward_hook(lambda *a: ran.append("head"))
    try:
        states = capture(backbone, torch.randint(5, 300, (1, 8)), layers=[0, 1])
    finally:
        for h in [*handles, head]:
            h.remove()
    assert ran == [0]  # block 1 ran (to produce layer 1); blocks 2.. and the head did not
    assert sorted(states) == [0, 1]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_batching_with_padding_equals_single_sequences(arch, tiny_models):
    backbone = load_backbone(str(tiny_models(arch)), device="cpu")
    g = torch.Generator().manual_seed(3)
    lengths = [16, 9, 4]
    seqs = [torch.randint(5, 300, (n,), generator=g) for n in lengths]
    ids = torch.zeros(3, 16, dtype=torch.long)
    mask = torch.zeros(3, 16, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    batched = capture(backbone, ids, mask, layers=range(backbone.num_layers + 1))
    for i, s in enumerate(seqs):
        single = capture(backbone, s[None], layers=range(backbone.num_layers + 1))
        for layer in single:
            torch.testing.assert_close(batched[layer][i, : len(s)], single[layer][0], rtol=1e-5, atol=1e-5)


def test_select_positions_skips_specials_and_sink_and_is_seeded():
    import numpy as np

    tokens = np.array([1, 7, 8, 0, 9, 10, 11, 12, 0, 0])  # 1 = BOS, 0 = pad
    special = np.array([0, 1])
    assert select_positions(tokens, special, 1, "all").tolist() == [1, 2, 4, 5, 6, 7]
    assert select_positions(tokens, special, 3, "all").tolist() == [4, 5, 6, 7]
    picks = [select_positions(tokens, special, 1, "random:3", np.random.default_rng(s)).tolist() for s in range(20)]
    assert all(len(p) == 3 and set(p) <= {1, 2, 4, 5, 6, 7} and p == sorted(p) for p in picks)
    assert len({tuple(p) for p in picks}) > 3
    assert picks[0] == select_positions(tokens, special, 1, "random:3", np.random.default_rng(0)).tolist()
    assert select_positions(tokens, special, 1, "random:50", np.random.default_rng(0)).tolist() == [1, 2, 4, 5, 6, 7]
