"""The micro-batch descriptor: protobuf round trip, validation, and an SDK that imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from knittrans.errors import InvalidArgument
from knittrans.packed.tensors import PackedEncodingUse, TensorSpec
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.types import DType, UnitKey


def descriptor(**overrides) -> MicroBatchDescriptor:
    values = dict(
        ticket=3, incarnation="1-2", sequence=5, train_batch_index=1, minibatch_index=1, num_minibatches=2,
        train_version=7, microbatch_index=0, num_microbatches=2, last_in_minibatch=False,
        minibatch_loss_tokens=900, microbatch_loss_tokens=400, segment="knittrans-j-backbone-dp0-cp0-ab-s0-g1",
        slot=0, used_bytes=192,
        tensors=(TensorSpec(name="input_ids", dtype=DType.INT32, shape=(16,), offset=0),
                 TensorSpec(name="routing", dtype=DType.UINT8, shape=(16, 4), offset=64),
                 TensorSpec(name="labels", dtype=DType.INT64, shape=(8,), offset=128)),
        role="backbone", dp_rank=0, cp_rank=0, cp=2, tp=2, trajectory_ids=("t1", "t2"), trajectory_indices=(0, 3),
        encodings=(PackedEncodingUse(encoding_id=0, key=UnitKey("j/s/s0/mm/abcdef01"), packed_start=2,
                                     packed_end=6, row_start=0, trajectory_id="t1", reference=0),),
    )
    values.update(overrides)
    return MicroBatchDescriptor(**values)


def test_round_trip() -> None:
    original = descriptor()
    assert MicroBatchDescriptor.from_proto(original.to_proto()) == original
    assert original.key == (5, 0)
    assert original.tensor("routing").byte_length == 64


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tensors": (TensorSpec(name="a", dtype=DType.UINT8, shape=(100,), offset=0),
                      TensorSpec(name="b", dtype=DType.UINT8, shape=(4,), offset=64))}, "tensors"),
        ({"used_bytes": 100}, "used_bytes"),
        ({"ticket": 0}, "ticket"),
        ({"microbatch_index": 2}, "microbatch_index"),
    ],
)
def test_invalid_descriptors_name_the_field(overrides, field) -> None:
    with pytest.raises(InvalidArgument) as info:
        descriptor(**overrides)
    assert info.value.field == field


def test_offsets_are_64_byte_aligned() -> None:
    with pytest.raises(InvalidArgument) as info:
        TensorSpec(name="x", dtype=DType.UINT8, shape=(1,), offset=8)
    assert info.value.field == "x.offset"


def test_the_trainer_sdk_imports_without_torch() -> None:
    code = "import sys, knittrans.trainer, knittrans.trainer.client; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
