"""
SigLIP vision tower (So400m/14 at full size) without pooling (``docs/model.md#vision-tower``).

openpi ``models/siglip.py`` (variant "So400m/14", pool "none"): patch embedding by a strided
convolution, learned position embedding, pre-LN encoder blocks with biased projections and a
tanh-GELU MLP, a final LayerNorm. The linear projector to the VLM width lives in ``Pi05Model``.
"""

from __future__ import annotations

from oxygen_ros.config import VisionConfig
from oxygen_ros.model.flex import vision_attention

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812


LAYER_NORM_EPS = 1e-6


class SiglipBlock(nn.Module):
    """``x += MHSA(LN(x)); x += MLP(LN(x))``; Q/K/V fused as ``[3 Wv, Wv]`` with bias."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(cfg.width, eps=LAYER_NORM_EPS)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.out = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width, eps=LAYER_NORM_EPS)
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[B, T, Wv]`` to ``[B, T, Wv]`` (full bidirectional attention, no mask)."""
        b, t, w = x.shape
        h = self.num_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, h, w // h).permute(2, 0, 3, 1, 4)
        attn = vision_attention(q, k, v)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, w))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate='tanh'))


class SiglipTower(nn.Module):
    """
    Images to patch tokens.

    Token order is row-major over the ``(S / patch)²`` patch grid, as openpi and HF.
    """

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size,
                                     stride=cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.empty(cfg.num_tokens, cfg.width))
        self.blocks = nn.ModuleList(SiglipBlock(cfg) for _ in range(cfg.depth))
        self.final_norm = nn.LayerNorm(cfg.width, eps=LAYER_NORM_EPS)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """
        Encode images.

        The patch and position embeddings run in their own dtype (float32 when the model is in
        16 bits, as openpi), the blocks in that of the final LayerNorm.

        :param images: ``[M, 3, S, S]`` in [-1, 1], S = ``cfg.image_size``.
        :returns: ``[M, Ti, Wv]`` tokens after the final LayerNorm, in its dtype.
        """
        x = self.patch_embed(images.to(self.patch_embed.weight.dtype))
        x = (x.flatten(2).transpose(1, 2) + self.pos_embed).to(self.final_norm.weight.dtype)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


__all__ = ['SiglipBlock', 'SiglipTower']
