"""The posterior-view converter: a noisy token state z becomes a mixture over the V tokens
plus one mask slot, and the mixture selects a source vector from an embedding table.

Logits are beta <z, e_v> + b_v for the tokens and b_mask for the mask slot (its key is the
zero vector). With beta = 1 and b = log p(v) the token part is the exact posterior of the
channel; b_mask starts at log V so that z = 0 (no information) puts probability 1/2 on the
mask slot at initialisation, and a clean z (large s) puts almost all of it on the token.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Converter(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.beta = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.mask_bias = nn.Parameter(torch.tensor(math.log(vocab_size)))

    def forward(self, z: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """(B, L, d_tok) states -> (B, L, V + 1) probabilities; the last slot is the mask."""
        token_logits = torch.addmm(self.bias, (self.beta * z).flatten(0, -2), table.T).view(*z.shape[:-1], -1)
        mask_logit = self.mask_bias.to(token_logits.dtype).expand(*token_logits.shape[:-1], 1)
        return torch.cat([token_logits, mask_logit], dim=-1).softmax(dim=-1)

    @staticmethod
    def mix(probs: torch.Tensor, embeddings: torch.Tensor, mask_vector: torch.Tensor) -> torch.Tensor:
        """sum_v pi_v E[v] + pi_mask m: the source vector of each position. The product takes
        `embeddings`' dtype (a bf16 table: bf16 inputs, float32 accumulation) and returns `probs`'."""
        mixed = (probs[..., :-1].to(embeddings.dtype) @ embeddings).to(probs.dtype)
        return mixed + probs[..., -1:] * mask_vector
