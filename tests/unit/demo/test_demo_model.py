"""The demo model's attention layouts and configuration (single process; CP across ranks is tested in
tests/integration/demo)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from knittrans.demo.context_parallel import causal_mask, local_attention, segment_ids_from_cu_seqlens
from knittrans.demo.model import (
    Backbone,
    BackboneConfig,
    Block,
    EncoderConfig,
    VisionLanguageConfig,
    VisionLanguageModel,
    pixels,
)
from knittrans.errors import InvalidArgument


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_sequence_ids_follow_cu_seqlens_and_trailing_padding_is_its_own() -> None:
    ids = segment_ids_from_cu_seqlens(torch.tensor([0, 3, 5], dtype=torch.int32), 8, trailing_id=9)
    assert ids.tolist() == [0, 0, 0, 1, 1, 9, 9, 9]
    assert segment_ids_from_cu_seqlens(torch.tensor([0]), 2, trailing_id=0).tolist() == [0, 0]


def test_mask_is_causal_by_global_position_within_a_sequence() -> None:
    # One CP rank's view: it holds positions 0-1 and 6-7 of a sequence whose other chunks are elsewhere.
    queries = torch.tensor([0, 1, 6, 7])
    keys = torch.tensor([0, 1, 6, 7, 2, 3, 4, 5])
    mask = causal_mask(queries, torch.zeros(4, dtype=torch.long), keys, torch.zeros(8, dtype=torch.long))[0, 0]
    assert mask[1].tolist() == [True, True, False, False, False, False, False, False]
    assert mask[2].tolist() == [True, True, True, False, True, True, True, True]
    other = causal_mask(queries, torch.zeros(4, dtype=torch.long), keys, torch.ones(8, dtype=torch.long))
    assert not other.any()


def test_local_attention_matches_the_segment_path() -> None:
    torch.manual_seed(0)
    backbone = Backbone(BackboneConfig(vocab_size=32, dim=16, depth=2, heads=2))
    # Two sequences (5 and 4 tokens, padded to 6 each), then trailing padding of the packed stream.
    input_ids = torch.randint(1, 32, (14,))
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1])
    cu_seqlens = torch.tensor([0, 6, 12], dtype=torch.int32)
    segments = torch.tensor([0] * 6 + [1] * 6 + [2] * 2)
    want = backbone(input_ids, position_ids=positions, segment_ids=segments)
    got = backbone(input_ids, position_ids=positions, attention=local_attention(positions, cu_seqlens))
    assert torch.equal(got, want)


def test_a_block_gathering_only_its_own_keys_is_unchanged() -> None:
    torch.manual_seed(0)
    block = Block(16, 2, 2, 0.0)
    x = torch.randn(1, 5, 16)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    assert torch.allclose(block(x, mask, lambda rows: rows), block(x, mask))


def test_positions_beyond_the_embedding_are_refused() -> None:
    backbone = Backbone(BackboneConfig(vocab_size=32, dim=16, depth=1, heads=2, max_positions=8))
    with pytest.raises(InvalidArgument, match="max_positions"):
        backbone(torch.ones(2, dtype=torch.long), position_ids=torch.tensor([0, 8]), segment_ids=torch.zeros(2))


def test_vision_language_model_fills_placeholders_with_encoder_rows() -> None:
    config = VisionLanguageConfig()
    model = VisionLanguageModel(config)
    images = torch.randint(0, 256, (2, *config.image_shape), dtype=torch.uint8)
    rows = model.encoder(pixels(images))
    assert rows.shape == (2, config.rows_per_image, config.backbone.dim)
    with pytest.raises(InvalidArgument) as error:
        VisionLanguageConfig(encoder=EncoderConfig(out_dim=32), backbone=BackboneConfig(dim=64))
    assert error.value.field == "encoder.out_dim"


def test_pixels_never_view_their_input() -> None:
    images = torch.full((1, 3, 4, 4), 255, dtype=torch.uint8)
    converted = pixels(images)
    assert converted.dtype == torch.float32 and float(converted.max()) == 1.0
    floats = torch.zeros(1, 3, 4, 4)
    assert pixels(floats).data_ptr() != floats.data_ptr()
