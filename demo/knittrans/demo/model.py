"""Small multimodal models for the demo, the tests and the encoder deduplication benchmark.

- :class:`VisionEncoder` is ViT-like: patch embedding, transformer blocks with bidirectional attention over
  each image's patches, and a merger that folds each 2×2 patch neighbourhood into one backbone row (as
  Qwen-VL does), so an image of ``(image_size / patch_size)²`` patches yields ``num_rows`` rows.
- :class:`Backbone` is a decoder-only transformer over packed sequences: causal attention within each
  sequence, with encoder rows inserted at placeholder token positions before the first block. Under context
  parallelism it takes an :class:`~knittrans.demo.context_parallel.AttentionLayout` whose keys and values
  are gathered across the CP group (:mod:`knittrans.demo.context_parallel`).
- :class:`VisionLanguageModel` pairs the two for the demo's trainer ranks.

Both are per-sample functions in training mode (LayerNorm, no BatchNorm), as encoding reuse requires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from knittrans.errors import InvalidArgument

if TYPE_CHECKING:
    from knittrans.demo.context_parallel import AttentionLayout

PLACEHOLDER_TOKEN = 0
"""Token id that marks where encoder rows go; text tokens are 1..vocab_size-1."""


@dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    image_size: int = 16
    patch_size: int = 4
    channels: int = 3
    dim: int = 32
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    merge: int = 2
    out_dim: int = 32
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise InvalidArgument("must be a multiple of patch_size", field="image_size")
        if (self.image_size // self.patch_size) % self.merge:
            raise InvalidArgument("image_size / patch_size must be a multiple of merge", field="merge")
        if self.dim % self.heads:
            raise InvalidArgument("must be a multiple of heads", field="dim")

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_rows(self) -> int:
        """Rows (backbone tokens) per image after merging."""
        return (self.patches_per_side // self.merge) ** 2


@dataclass(frozen=True, kw_only=True)
class BackboneConfig:
    vocab_size: int = 64
    dim: int = 32
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 512
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise InvalidArgument("must be a multiple of heads", field="dim")


class Block(nn.Module):
    """Pre-norm transformer block with multi-head self-attention and a GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.mlp_dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        gather_keys: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x``: (batch, tokens, dim); ``attn_mask``: bool (batch or 1, 1, tokens, keys), True = attend.

        ``gather_keys`` (context parallelism, batch 1) maps this rank's ``(tokens, …)`` rows to the rows of
        every CP rank, ``(keys, …)``; keys and values go through it together, queries stay local.
        """
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, dim // self.heads).unbind(2)
        if gather_keys is not None:
            if batch != 1:
                raise InvalidArgument("context parallelism runs on one packed sequence stream", field="x")
            head_dim = dim // self.heads
            k, v = gather_keys(torch.cat([k[0], v[0]], dim=-1)).unsqueeze(0).split(head_dim, dim=-1)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp_dropout(self.mlp(self.norm2(x)))


class VisionEncoder(nn.Module):
    """images (batch, channels, size, size) -> encodings (batch, num_rows, out_dim)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = nn.Conv2d(config.channels, config.dim, config.patch_size, stride=config.patch_size)
        self.position = nn.Parameter(torch.randn(1, config.patches_per_side**2, config.dim) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config.dim, config.heads, config.mlp_ratio, config.dropout) for _ in range(config.depth)
        )
        self.norm = nn.LayerNorm(config.dim)
        merged = config.dim * config.merge**2
        self.merger = nn.Sequential(nn.Linear(merged, merged), nn.GELU(), nn.Linear(merged, config.out_dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.position
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        batch, side, merge = x.shape[0], c.patches_per_side, c.merge
        # Fold each merge×merge neighbourhood of patches into one row.
        x = x.view(batch, side // merge, merge, side // merge, merge, c.dim).permute(0, 1, 3, 2, 4, 5)
        return self.merger(x.reshape(batch, c.num_rows, merge * merge * c.dim))


class Backbone(nn.Module):
    """Decoder-only transformer over one packed micro-batch of sequences."""

    def __init__(self, config: BackboneConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.position = nn.Embedding(config.max_positions, config.dim)
        self.blocks = nn.ModuleList(
            Block(config.dim, config.heads, config.mlp_ratio, config.dropout) for _ in range(config.depth)
        )
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        segment_ids: torch.Tensor | None = None,
        features: torch.Tensor | None = None,
        feature_positions: torch.Tensor | None = None,
        attention: AttentionLayout | None = None,
    ) -> torch.Tensor:
        """Logits (tokens, vocab) for packed ``input_ids`` (tokens,).

        A token attends to the tokens of its own segment (sequence) whose position id is not larger.
        ``features[j]`` replaces the embedding of token ``feature_positions[j]``. With ``attention`` (context
        parallelism) the mask and the key gathering come from it, and ``segment_ids`` is not used.
        """
        if position_ids.numel() and int(position_ids.max()) >= self.config.max_positions:
            raise InvalidArgument(
                f"position {int(position_ids.max())} is beyond max_positions={self.config.max_positions}",
                field="position_ids",
            )
        x = self.embed(input_ids) + self.position(position_ids)
        if features is not None and feature_positions is not None and features.numel():
            x = x.index_put((feature_positions,), features.to(x.dtype))
        if attention is None:
            if segment_ids is None:
                raise InvalidArgument("needs segment_ids or an attention layout", field="segment_ids")
            same_segment = segment_ids[:, None] == segment_ids[None, :]
            causal = position_ids[None, :] <= position_ids[:, None]
            mask, gather = (same_segment & causal)[None, None], None
        else:
            mask, gather = attention.mask, attention.gather
        x = x[None]
        for block in self.blocks:
            x = block(x, mask, gather)
        return self.head(self.norm(x[0]))


@dataclass(frozen=True, kw_only=True)
class VisionLanguageConfig:
    """The demo's vision-language model: encoder rows are backbone token embeddings, so their widths match."""

    encoder: EncoderConfig = field(
        default_factory=lambda: EncoderConfig(image_size=32, patch_size=4, dim=64, depth=2, heads=4, out_dim=64)
    )
    backbone: BackboneConfig = field(
        default_factory=lambda: BackboneConfig(vocab_size=64, dim=64, depth=2, heads=4, max_positions=256)
    )

    def __post_init__(self) -> None:
        if self.encoder.out_dim != self.backbone.dim:
            raise InvalidArgument(
                f"encoder.out_dim {self.encoder.out_dim} must equal backbone.dim {self.backbone.dim}",
                field="encoder.out_dim",
            )

    @property
    def rows_per_image(self) -> int:
        return self.encoder.num_rows

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.encoder.channels, self.encoder.image_size, self.encoder.image_size)


class VisionLanguageModel(nn.Module):
    """A small ViT-like encoder and a decoder-only backbone; encoder rows fill placeholder tokens."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = VisionEncoder(config.encoder)
        self.backbone = Backbone(config.backbone)


def pixels(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (batch, channels, size, size) as float32 in [-1, 1]: a fresh tensor, never a view of the
    input (the encoder keeps its input for backward, and the input may live in a reused shared-memory slot)."""
    if images.dtype == torch.uint8:
        return images.to(torch.float32) / 127.5 - 1.0
    return images.to(torch.float32, copy=True)


def token_loss(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Sum of masked next-token cross-entropies divided by ``normalizer`` (the mini-batch's loss tokens)."""
    per_token = F.cross_entropy(logits, labels, reduction="none")
    return (per_token * loss_mask).sum() / normalizer


def initial_model(seed: int) -> VisionLanguageModel:
    """The demo's initial policy for ``seed``: what every actor rank starts from (rank 0's, broadcast) and what the
    frozen reference role keeps (:mod:`knittrans.demo.reference_rank`)."""
    torch.manual_seed(seed)
    return VisionLanguageModel(VisionLanguageConfig())


def parameters_digest(model: nn.Module) -> str:
    """A content hash of every parameter and buffer, in state-dict order: equal digests, equal models."""
    from knittrans.store.hashing import content_hash

    data = b"".join(tensor.detach().contiguous().numpy().tobytes() for tensor in model.state_dict().values())
    return content_hash(data)
