"""Transformer blocks shared by the DSL denoiser and the hidden-state bridge.

Pre-norm blocks with rotary position embeddings, PyTorch's fused scaled-dot-product
attention and a SwiGLU MLP. Attention is bidirectional by default; `causal` lets position i
attend only to positions <= i, so a sequence can be read one position at a time with each
block's keys and values kept (`KVCache`). An optional conditioning vector (the bridge's
interpolation time) modulates every block through adaLN (shift, scale and a zero-initialised
gate, so a fresh block starts as the identity).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TransformerConfig:
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: float = 4.0
    cond_dim: int = 0  # 0: no conditioning input
    rope_base: float = 10000.0
    causal: bool = False  # True: position i attends to positions <= i only


class KVCache:
    """What a causal network keeps of the positions it has read, to read the next ones alone:
    each block's keys and values, and `left`, free for the caller (the bridge keeps the last
    rows of its input convolution there)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.left: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions read so far."""
        return self.keys[0].shape[2] if self.keys else 0

    def extend(self, block: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block `block`'s keys and values (B, H, L, Dh) of every position read, the new ones `k`, `v` appended."""
        if block == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[block] = torch.cat([self.keys[block], k], dim=2)
            self.values[block] = torch.cat([self.values[block], v], dim=2)
        return self.keys[block], self.values[block]


def rotary_tables(length: int, head_dim: int, base: float, device, dtype):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, Dh): rotate pairs (first half, second half) by the position angle."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.causal = cfg.n_heads, cfg.causal
        self.norm1 = nn.LayerNorm(d, elementwise_affine=cfg.cond_dim == 0)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=cfg.cond_dim == 0)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        hidden = int(cfg.mlp_ratio * d * 2 / 3)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.modulation = None
        if cfg.cond_dim:
            self.modulation = nn.Linear(cfg.cond_dim, 6 * d)
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)

    def forward(self, x, cos, sin, cond=None, attn_mask=None, cache: KVCache | None = None, index: int = 0):
        """`cache` (causal blocks): x holds the positions after those the cache has read (`cos`,
        `sin` are theirs); this block's keys and values are kept in it as block `index`."""
        if self.modulation is not None:
            shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond)[:, None, :].chunk(6, dim=-1)
        else:
            shift1 = scale1 = shift2 = scale2 = 0.0
            gate1 = gate2 = None
        h = self.norm1(x) * (1 + scale1) + shift1
        b, length, d = h.shape
        q, k, v = self.qkv(h).view(b, length, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        causal = self.causal and cache is None  # with a cache, the Transformer passes the offset mask
        if cache is not None:
            k, v = cache.extend(index, k, v)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
        attn = self.proj(attn.transpose(1, 2).reshape(b, length, d))
        x = x + (attn if gate1 is None else gate1 * attn)
        h = self.norm2(x) * (1 + scale2) + shift2
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        mlp = self.down(F.silu(gate) * up)
        return x + (mlp if gate2 is None else gate2 * mlp)


class Transformer(nn.Module):
    """(B, L, d_model) -> (B, L, d_model), bidirectional (or causal: `cfg.causal`), rotary positions."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
            raise ValueError("d_model must split into an even head size")
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x, cond=None, attn_mask=None, cache: KVCache | None = None):
        """With a `cache` (a causal network only), x holds the positions after those the cache has
        read: each attends to those and to itself and the positions before it in x."""
        start = 0
        if cache is not None:
            if not self.cfg.causal:
                raise ValueError("a bidirectional network cannot read a sequence one part at a time")
            start = cache.length
            if x.shape[1] > 1:  # new positions after cached ones: the causal mask, offset by the cache
                attn_mask = torch.ones(x.shape[1], start + x.shape[1], dtype=torch.bool, device=x.device).tril(start)
        cos, sin = rotary_tables(start + x.shape[1], self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_base,
                                 x.device, x.dtype)
        cos, sin = cos[start:], sin[start:]
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, cond, attn_mask, cache, index)
        return self.norm(x)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices natively (CUDA; a CPU with AVX512-BF16 or AMX,
    where oneDNN runs them at ~1.9x float32's rate); elsewhere bf16 would be emulated, slower."""
    return device.type == "cuda" or (device.type == "cpu" and torch.backends.mkldnn.is_available()
                                     and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def full_precision(device: torch.device):
    """A block computed in float32 even under the training loop's bf16 autocast (a device type
    without autocast has nothing to turn off)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return nullcontext()


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of a scalar per sequence (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)
