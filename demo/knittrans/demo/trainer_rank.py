"""One trainer rank of the demo: consumes its sidecars through ``TrainerClient`` and trains the small VLM.

Run by ``knittrans demo`` as ``python -m knittrans.demo.trainer_rank RUN.json RANK``. The rank joins a gloo
process group (dp × cp ranks), reads its backbone sidecar (and, on global ranks below the encoder's dp, its
encoder sidecar), steps once per mini-batch with encoding reuse, and writes one JSON line per step. So that
the demo can prove the bytes trained are the bytes written, each rank also records what it received of every
per-token field (the real tokens of its CP chunks) and of every image.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from knittrans.config import build
from knittrans.store.hashing import content_hash

logger = logging.getLogger(__name__)

# A checkpoint report outlasts an admission service restart (and a Redis one under it).
CHECKPOINT_REPORT_SECONDS = 120.0


@dataclass(frozen=True, kw_only=True)
class RankRun:
    """What every rank needs to know about the running stack (written by the orchestrator)."""

    admission: str
    master_port: int
    dp: int
    cp: int
    encoder_dp: int
    steps: int
    learning_rate: float
    seed: int
    backbone_sockets: tuple[str, ...]  # indexed by global rank = dp_rank · cp + cp_rank
    encoder_sockets: tuple[str, ...]  # indexed by encoder dp rank
    out: str
    # The chaos run: checkpoint after every step, log applied steps for the oracle, restore at start
    # (knittrans.demo.chaos.checkpoint); a mini-batch that comes as a typed error is logged and skipped.
    chaos: bool = False
    # With the reference role (--roles reference,actor): the weight of the KL term against its ref_logprobs
    kl_coefficient: float = 0.0


class RecordingMiniBatch:
    """A mini-batch whose micro-batches are recorded (field bytes per CP chunk) as the training loop takes them."""

    def __init__(self, mini: Any, cp: int, pieces: list[dict]) -> None:
        self._mini = mini
        self._cp = cp
        self._pieces = pieces
        # The training loop's waits for the micro-batches after the first: the first one's wait happens when the
        # mini-batch is taken, and may be a wait for admission rather than for data.
        self.later_wait_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mini, name)

    def __iter__(self) -> Iterator[Any]:
        from knittrans.packed.layout import item_offsets

        assignment = self._mini.assignment
        for position_in_minibatch, micro in enumerate(self._mini):
            if position_in_minibatch:
                self.later_wait_seconds += micro.waited_seconds
            planned = assignment.microbatches[micro.index]
            offsets = item_offsets(planned, self._cp)
            for item, offset in zip(planned.items, offsets, strict=True):
                for position, chunk in enumerate(item.chunks):
                    if not chunk.tokens.length:
                        continue
                    start = offset + position * chunk.padded.length + chunk.tokens.start - chunk.padded.start
                    for read in item.reads:
                        name = read.unit.field_name
                        if not read.spans or name not in micro:
                            continue
                        rows = micro[name][start : start + chunk.tokens.length]
                        self._pieces.append({
                            "trajectory": item.trajectory.trajectory_id, "field": name, "key": read.unit.key,
                            "start": chunk.tokens.start, "end": chunk.tokens.end,
                            "bytes": base64.b64encode(rows.contiguous().numpy().tobytes()).decode(),
                        })
            yield micro


class RecordingEncoderMiniBatch:
    """An encoder mini-batch whose images are hashed as the training loop takes them."""

    def __init__(self, mini: Any, images: dict[str, str]) -> None:
        self._mini = mini
        self._images = images

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mini, name)

    def __iter__(self) -> Iterator[Any]:
        for micro in self._mini:
            for k, assignment in enumerate(micro.encoder_inputs):
                image = micro["inputs"][k] if "inputs" in micro else micro[f"inputs.{k}"]
                self._images[assignment.encoding.key] = content_hash(image.contiguous().numpy().tobytes())
            yield micro


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run = build(RankRun, json.loads(Path(args[0]).read_text()))
    rank = int(args[1])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    import torch
    import torch.distributed as dist

    from knittrans.client.admission import AdmissionClient
    from knittrans.client.connection import ConnectionSettings
    from knittrans.demo.chaos.checkpoint import RankHistory, any_rank_failed, commit_checkpoint
    from knittrans.demo.model import initial_model, parameters_digest
    from knittrans.demo.training import DemoTrainer, Parallelism, step_on_trainer_minibatch
    from knittrans.errors import MiniBatchRestarted
    from knittrans.trainer import TrainerClient, TrainerSettings

    torch.set_num_threads(1)
    torch.manual_seed(run.seed)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{run.master_port}", rank=rank, world_size=run.dp * run.cp
    )
    parallelism = Parallelism.from_world(dp=run.dp, cp=run.cp)
    trainer = DemoTrainer(initial_model(run.seed), parallelism, learning_rate=run.learning_rate,
                          kl_coefficient=run.kl_coefficient)
    out = Path(run.out)
    if rank == 0:  # the policy every rank starts from (rank 0's, broadcast): the reference role must equal it
        (out / "initial-policy.json").write_text(json.dumps({"digest": parameters_digest(trainer.model)}))
    history = RankHistory(out, rank) if run.chaos else None
    restored, restored_step, applied = (history.restore(trainer.model, trainer.optimizer, distributed=True)
                                        if history is not None else (None, None, 0))
    # A restored rank's sidecars deliver exactly the mini-batches after its checkpoint again (the admission service
    # retains them until a checkpoint covers them: retain_until_checkpoint); global rank 0 reports checkpoints.
    admission = ConnectionSettings(target=run.admission)
    backbone = TrainerClient(TrainerSettings(sidecar=run.backbone_sockets[rank], global_rank=rank, admission=admission),
                             restored_step=restored_step)
    encoder = (
        TrainerClient(TrainerSettings(sidecar=run.encoder_sockets[rank], global_rank=rank, admission=admission,
                                      advance_version=False), restored_step=restored_step)
        if rank < run.encoder_dp else None
    )
    checkpoints = (AdmissionClient(admission, deadline=timedelta(seconds=CHECKPOINT_REPORT_SECONDS))
                   if history is not None and rank == 0 else None)
    report = checkpoints.report_checkpoint if checkpoints is not None else None
    # Appended to: a restarted rank (chaos) keeps what it logged before; a fresh run starts in an empty directory.
    steps_file = open(out / f"steps-rank{rank}.jsonl", "a")
    pieces_file = open(out / f"received-rank{rank}.jsonl", "a")
    encoder_minis = encoder.mini_batches() if encoder is not None else None
    waiting_since = time.time()  # wall clock, comparable with the service's admission times
    # Sequences count mini-batches from 1. A restarted job ends at the last one even if a step in between never
    # came back (its data was lost with the store): the oracle names what was lost, where counting applied steps
    # would wait for a mini-batch that never comes.
    done = restored is not None and restored >= run.steps
    try:
        for mini in ([] if done else backbone.mini_batches()):
            encoder_mini = next(encoder_minis) if encoder_minis is not None else None
            if history is not None and any_rank_failed(mini, encoder_mini):
                history.append({"event": "failed", "rank": rank, "sequence": mini.sequence,
                                "train_batch": mini.train_batch_index, "minibatch": mini.minibatch_index,
                                "planned": list(mini.context.admitted_trajectory_ids)})
                applied += 1
                commit_checkpoint(history, trainer.model, trainer.optimizer, mini=mini, applied=applied,
                                  report=report)
                mini.complete()
                if encoder_mini is not None:
                    encoder_mini.complete()
                if applied >= run.steps or mini.sequence >= run.steps:
                    break
                continue
            step = applied
            received_at = time.time()
            pieces: list[dict] = []
            started = time.perf_counter()
            images: dict[str, str] = {}
            recording = RecordingMiniBatch(mini, run.cp, pieces)
            try:
                result = step_on_trainer_minibatch(
                    trainer,
                    recording,
                    encoder_mini=RecordingEncoderMiniBatch(encoder_mini, images) if encoder_mini is not None else None,
                )
            # A MiniBatchFailed raised partway (a unit lost after the good verdict, while the other ranks are in
            # this step's collectives) ends this process: the demo restarts the world, which restores the last
            # checkpoint (BEFORE_FIRST_STEP before the first) and gets this mini-batch again, failed at once.
            except MiniBatchRestarted as restart:
                # Another TP rank of a consumer restarted mid-way: the mini-batch comes again, whole; this partial
                # step is dropped. (The demo's consumers have one TP rank each: a restart restarts the world.)
                logger.warning("%s; dropping the partial step", restart)
                trainer.optimizer.zero_grad(set_to_none=True)
                continue
            steps_file.write(json.dumps({
                "rank": rank, "dp_rank": parallelism.dp_rank, "cp_rank": parallelism.cp_rank, "step": step,
                "sequence": mini.sequence, "train_batch": mini.train_batch_index, "minibatch": mini.minibatch_index,
                "train_version": mini.train_version, "loss": result.loss, "kl": result.kl,
                "loss_tokens": result.loss_tokens,
                "micro_batches": result.micro_batches, "encodings_computed": result.encodings_computed,
                "encoding_references": result.encoding_references, "dedup_factor": result.dedup_factor,
                "waiting_since": waiting_since, "received_at": received_at,
                "later_wait_seconds": recording.later_wait_seconds, "compute_seconds": result.compute_seconds,
                "step_seconds": time.perf_counter() - started, "finished_at": time.time(),
                "bytes_needed": mini.assignment.needed_bytes
                + (encoder_mini.assignment.needed_bytes if encoder_mini is not None else 0),
                "trajectories": sorted({p["trajectory"] for p in pieces}), "images_encoded": images,
            }) + "\n")
            steps_file.flush()
            for piece in pieces:
                pieces_file.write(json.dumps(piece) + "\n")
            pieces_file.flush()
            applied += 1
            if history is not None:
                history.append({"event": "step", "rank": rank, "sequence": mini.sequence,
                                "train_batch": mini.train_batch_index, "minibatch": mini.minibatch_index,
                                "planned": list(mini.context.admitted_trajectory_ids), "pieces": pieces,
                                "images": images})
                commit_checkpoint(history, trainer.model, trainer.optimizer, mini=mini, applied=applied,
                                  report=report)
            mini.complete()
            if encoder_mini is not None:
                encoder_mini.complete()
            if applied >= run.steps or (history is not None and mini.sequence >= run.steps):
                break
            waiting_since = time.time()
    finally:
        steps_file.close()
        pieces_file.close()
        backbone.close()
        if encoder is not None:
            encoder.close()
        if checkpoints is not None:
            checkpoints.close()
        if history is not None:
            history.close()
        dist.destroy_process_group()
    logger.info("trained %d mini-batches", run.steps)
    return 0


def received_hashes(pieces_by_unit: dict[str, list[dict]]) -> dict[str, str]:
    """Reassemble each unit from the pieces every rank received; the content hash of what was trained."""
    hashes = {}
    for key, pieces in pieces_by_unit.items():
        ordered = sorted(pieces, key=lambda p: p["start"])
        position = 0
        data = bytearray()
        for piece in ordered:
            if piece["start"] != position:
                break  # a gap or an overlap: the hash will not match
            data += base64.b64decode(piece["bytes"])
            position = piece["end"]
        hashes[key] = content_hash(bytes(data))
    return hashes


if __name__ == "__main__":
    sys.exit(main())
