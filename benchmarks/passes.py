"""Several passes over a mini-batch (``TrainerClient.mini_batches(passes=P)``): what each design costs a trainer
rank, side by side, on one clock (``time.perf_counter``), arms interleaved round by round.

One mini-batch of ``--microbatches`` packed micro-batches (``--tokens`` tokens each: int64 input_ids, labels
and position_ids, float32 log-probs and advantages, uint8 loss_mask) is written to a real file unit store; each
micro-batch is one real shared-memory slot, staged with the client's real :class:`~knittrans.trainer.staging.
Stager` (CPU: this machine has no GPU). The loop "trains" by reading every byte of every tensor, every pass.

- ``slot_hold``: the sidecar keeps each slot until the last pass; the tensors are zero-copy views. Needs a ring
  of at least ``microbatches`` slots (or it deadlocks), and a way for the sidecar to tell a rank that holds
  slots across passes from one that has not begun (its restart rounds count releases): protocol work.
- ``client_copy`` (implemented): the prefetch thread copies each micro-batch out of its slot, which is then
  released; the last one's slot is held instead. The ring keeps its size.
- ``reread`` (the naive baseline): each pass reads the units from the store again into the slot
  (amplification P x).

Per arm: ``staging_s`` (prefetch-thread work: store reads and copies; off the loop's critical path when
compute is longer), ``loop_s`` (the loop's reads over all passes), ``store_bytes_read``, ``amplification``
(bytes read / unique bytes), ``slots_needed`` and ``extra_private_bytes`` (the client's copies).

    python benchmarks/passes.py [--passes 3] [--microbatches 8] [--tokens 16384] [--rounds 5]

What it showed (2 shared CPU cores, 3 passes, 8 micro-batches of 65536 tokens, 17 MB; medians of 5 rounds):
slot_hold 0.085 s, client_copy 0.114 s, reread 0.157 s; amplification 1.00x, 1.00x, 3.00x. On CPU holding
the slots is cheaper by one memcpy of the mini-batch (done on the prefetch thread), but it needs a ring as large
as the mini-batch and the sidecar protocol changes above; on CUDA the staged copy is already the rank's own GPU
memory, so keeping it costs no copy at all, while slot_hold would stage every pass again (or hold the same GPU
memory). Hence the client keeps the copy (docs/integration.md, "Several passes").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from knittrans.packed.tensors import TensorSpec
from knittrans.shm import OwnedSegment
from knittrans.store.factory import open_store
from knittrans.store.protocol import UnitStore, UnitWrite
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.trainer.staging import Stager
from knittrans.types import DType, UnitKey

FIELDS = (("input_ids", DType.INT64), ("labels", DType.INT64), ("position_ids", DType.INT64),
          ("old_logprobs", DType.FLOAT32), ("advantages", DType.FLOAT32), ("loss_mask", DType.UINT8))
NUMPY = {DType.INT64: np.int64, DType.FLOAT32: np.float32, DType.UINT8: np.uint8}


def layout(tokens: int) -> tuple[tuple[TensorSpec, ...], int]:
    specs, offset = [], 0
    for name, dtype in FIELDS:
        specs.append(TensorSpec(name=name, dtype=dtype, shape=(tokens,), offset=offset))
        offset += tokens * np.dtype(NUMPY[dtype]).itemsize
        offset = -(-offset // 64) * 64
    return tuple(specs), offset


class MiniBatch:
    """The mini-batch's units in the store, and one slot per micro-batch."""

    def __init__(self, store: UnitStore, *, microbatches: int, tokens: int) -> None:
        self.store = store
        self.specs, self.used = layout(tokens)
        rng = np.random.default_rng(0)
        tag = uuid.uuid4().hex[:8]
        self.keys: list[list[UnitKey]] = []
        writes = []
        for index in range(microbatches):
            keys = []
            for name, dtype in FIELDS:
                key = f"bench-passes/{tag}/mb{index}/{name}"
                array = rng.integers(0, 100, tokens).astype(NUMPY[dtype])
                writes.append(UnitWrite.of_array(key, array, dtype, sequence=True))
                keys.append(UnitKey(key))
            self.keys.append(keys)
        store.put_many(writes)
        self.unique_bytes = sum(len(w.data) for w in writes)
        self.segments = [OwnedSegment(f"kt-bench-passes-{tag}-{i}", self.used) for i in range(microbatches)]
        self.descriptors = [MicroBatchDescriptor(
            ticket=i + 1, incarnation=tag, sequence=1, train_batch_index=0, minibatch_index=0, num_minibatches=1,
            train_version=0, microbatch_index=i, num_microbatches=microbatches, last_in_minibatch=i == microbatches - 1,
            minibatch_loss_tokens=0, microbatch_loss_tokens=0, segment=self.segments[i].name, slot=i,
            used_bytes=self.used, tensors=self.specs, role="backbone", dp_rank=0, cp_rank=0, cp=1, tp=1)
            for i in range(microbatches)]

    def read_into_slot(self, index: int) -> int:
        """The sidecar's read of one micro-batch's units into its slot (packing is a copy we leave out)."""
        buffer = self.segments[index].buf
        moved = 0
        for spec, key in zip(self.specs, self.keys[index], strict=True):
            moved += self.store.get_into(key, buffer[spec.offset:spec.end])
        return moved

    def close(self) -> None:
        for segment in self.segments:
            segment.unlink()


def train_on(tensors: dict[str, torch.Tensor]) -> float:
    return float(sum(float(t.to(torch.float64).sum()) for t in tensors.values()))


def arm(mini: MiniBatch, name: str, passes: int) -> dict[str, Any]:
    n = len(mini.descriptors)
    stager = Stager("cpu", materialise=False, prefetch=2)
    staging = loop = 0.0
    read = 0
    checksum = 0.0
    kept: list[dict[str, torch.Tensor]] = []
    extra = 0
    try:
        for number in range(passes):
            for index, descriptor in enumerate(mini.descriptors):
                if number == 0 or name == "reread":
                    started = time.perf_counter()
                    read += mini.read_into_slot(index)
                    stager.copy_for_passes = name == "client_copy" and index < n - 1
                    tensors, _, owned = stager.stage(descriptor)
                    staging += time.perf_counter() - started
                    if name != "reread":
                        kept.append(tensors)
                        extra += mini.used if owned else 0
                else:
                    tensors = kept[index]
                started = time.perf_counter()
                checksum += train_on(tensors)
                loop += time.perf_counter() - started
    finally:
        kept.clear()
        stager.close()
    return {"staging_s": staging, "loop_s": loop, "total_s": staging + loop, "store_bytes_read": read,
            "amplification": read / mini.unique_bytes, "slots_needed": n if name == "slot_hold" else 1,
            "extra_private_bytes": extra, "checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    arms = ("slot_hold", "client_copy", "reread")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as directory:
        store = open_store(f"file://{directory}/units")
        mini = MiniBatch(store, microbatches=args.microbatches, tokens=args.tokens)
        try:
            for round_index in range(args.rounds):
                order: Callable[[tuple[str, ...]], tuple[str, ...]] = (lambda a: a) if round_index % 2 == 0 \
                    else (lambda a: a[::-1])
                for name in order(arms):
                    runs[name].append(arm(mini, name, args.passes))
                    print(f"round {round_index} {name}: {runs[name][-1]['total_s']:.4f}s", file=sys.stderr)
        finally:
            mini.close()
            store.close()
    checksums = {run["checksum"] for a in arms for run in runs[a]}
    summary = {name: {key: statistics.median(run[key] for run in runs[name])
                      for key in runs[name][0] if key != "checksum"} for name in arms}
    baseline = summary["reread"]["total_s"]
    for name in arms:
        summary[name]["vs_reread"] = summary[name]["total_s"] / baseline if baseline else None
    print(json.dumps({
        "benchmark": "passes", "baseline": "reread",
        "config": {"passes": args.passes, "microbatches": args.microbatches, "tokens": args.tokens,
                   "rounds": args.rounds, "minibatch_bytes": mini.unique_bytes, "device": "cpu"},
        "same_data_every_arm": len(checksums) == 1,
        "arms": summary,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
