"""The demo's training step: one optimizer step of the vision-language model per admitted mini-batch.

Every trainer rank calls :meth:`DemoTrainer.step` once per mini-batch with

- its packed backbone micro-batches, in consumption order (``TrainerClient``'s :class:`~knittrans.trainer.
  MiniBatch` iterates exactly these; a list of tensor dicts works too). Each needs ``input_ids``, ``labels``
  (−100 where there is none), ``loss_mask`` (label-aligned, see :mod:`knittrans.demo.workload`),
  ``position_ids`` (global positions) and ``cu_seqlens``, in the reorg sidecar's packed layout;
- the images of the encodings this rank owns (a mapping from unit key to a uint8 image, or a callable that
  returns the pixels of one :class:`~knittrans.train.EncoderMicroBatch`);
- the mini-batch's :class:`~knittrans.train.EncodingSchedule`, the same on every rank
  (:func:`knittrans.train.schedule_from_plan` with the full plan, or gathered from every rank's assignments
  by :func:`knittrans.demo.schedule_exchange.exchange_encoding_schedule`);
- the mini-batch's global loss-token count (``MiniBatch.global_loss_tokens``).

With ``TrainerClient``, :func:`step_on_trainer_minibatch` does all of that from the rank's backbone mini-batch
and, on ranks that compute encodings, its encoder mini-batch.

The step runs the encoder once per unique image (:func:`knittrans.train.train_minibatch`), the backbone per
micro-batch with context-parallel attention when cp > 1, normalises the summed token losses by the global
count, sums the gradients of all ranks (data and context parallel) with one all-reduce, clips and steps
AdamW. All ranks of the world call it for every mini-batch; global rank = dp_rank · cp + cp_rank (tp = 1),
the order :func:`knittrans.train.megatron_backbone_rank` assumes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from knittrans.demo.context_parallel import AttentionLayout, context_parallel_attention, local_attention
from knittrans.demo.model import VisionLanguageModel, pixels
from knittrans.demo.schedule_exchange import exchange_encoding_schedule, rank_part, schedule_from_parts
from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.train import EncoderMicroBatch, EncodingSchedule
from knittrans.train.reuse import GatheredEncodings, train_minibatch
from knittrans.train.transport import LocalTransport, ProcessGroupTransport, Transport
from knittrans.types import UnitKey

logger = logging.getLogger(__name__)

LABEL_IGNORE_INDEX = -100


class PackedTensors(Protocol):
    """A packed micro-batch: tensors by name (a dict, or ``TrainerClient``'s ``MicroBatch``)."""

    def __getitem__(self, name: str) -> torch.Tensor: ...


ImageSource = Mapping[UnitKey, torch.Tensor] | Callable[[EncoderMicroBatch], torch.Tensor]


@dataclass(frozen=True, kw_only=True, eq=False)
class Parallelism:
    """Where this rank sits: ``rank = dp_rank · cp + cp_rank`` of a dp × cp world (tp = 1)."""

    dp: int = 1
    cp: int = 1
    dp_rank: int = 0
    cp_rank: int = 0
    cp_group: Any = None  # the ranks sharing this rank's DP rank; None when cp == 1
    reduce_group: Any = None  # gradients are summed over it (the whole dp × cp world)
    transport: Transport = field(default_factory=LocalTransport)
    distributed: bool = False

    def __post_init__(self) -> None:
        if self.dp < 1 or self.cp < 1:
            raise InvalidArgument(f"dp and cp must be positive, got dp={self.dp} cp={self.cp}", field="dp")
        if not (0 <= self.dp_rank < self.dp and 0 <= self.cp_rank < self.cp):
            raise InvalidArgument(
                f"rank (dp {self.dp_rank}, cp {self.cp_rank}) is outside {self.dp}×{self.cp}", field="dp_rank"
            )
        if self.cp > 1 and not self.distributed:
            raise InvalidArgument("context parallelism needs torch.distributed", field="cp")

    @property
    def rank(self) -> int:
        return self.dp_rank * self.cp + self.cp_rank

    @property
    def world_size(self) -> int:
        return self.dp * self.cp

    @classmethod
    def single_process(cls) -> Parallelism:
        return cls()

    @classmethod
    def from_world(cls, *, dp: int, cp: int) -> Parallelism:
        """The default process group as a dp × cp grid; creates the CP groups (a collective: call it on every
        rank, after ``init_process_group``)."""
        if not dist.is_available() or not dist.is_initialized():
            raise FailedPrecondition("torch.distributed is not initialised; call init_process_group first")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != dp * cp:
            raise InvalidArgument(f"the world has {world} ranks, dp × cp = {dp * cp}", field="dp")
        cp_group = None
        for d in range(dp):
            ranks = list(range(d * cp, (d + 1) * cp))
            group = dist.new_group(ranks) if cp > 1 else None  # every rank creates every group, in order
            if rank in ranks:
                cp_group = group
        return cls(
            dp=dp,
            cp=cp,
            dp_rank=rank // cp,
            cp_rank=rank % cp,
            cp_group=cp_group,
            reduce_group=None,
            transport=ProcessGroupTransport(),
            distributed=True,
        )


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One mini-batch on one rank; the loss and the counts are totals over every rank."""

    loss: float  # summed token losses / the global loss-token count
    loss_tokens: int  # loss tokens the ranks counted (equals the global count)
    micro_batches: int  # this rank's
    encodings_computed: int  # unique encodings, over all ranks
    encoding_references: int  # placeholders filled with encoder rows (image uses by trajectories), over all ranks
    grad_norm: float
    compute_seconds: float  # this rank's forward, backward and reduction (waits for micro-batches included)
    # TrainerClient deliveries only: the training loop's waits for this mini-batch's micro-batches (the first
    # one's wait happens before the step starts, when the mini-batch is taken; the others' inside the step)
    data_wait_seconds: float = 0.0
    kl: float = 0.0  # the mean k3 KL(policy || reference) per loss token (0 without a reference)

    @property
    def dedup_factor(self) -> float:
        """Image uses served per encoding computed (the duplicated path computes one per use)."""
        return self.encoding_references / self.encodings_computed if self.encodings_computed else 1.0


def broadcast_parameters(model: torch.nn.Module, parallelism: Parallelism) -> None:
    """Make every rank start from rank 0's parameters."""
    if not parallelism.distributed:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0, group=parallelism.reduce_group)


def packed_loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over the tokens the mask selects (and that have a label), and their count."""
    selected = (loss_mask != 0) & (labels != LABEL_IGNORE_INDEX)
    per_token = F.cross_entropy(logits, torch.where(selected, labels, 0), reduction="none")
    return (per_token * selected).sum(), selected.sum()


def label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels[t]) at every packed position t; 0 where there is no label (−100)."""
    has_label = labels != LABEL_IGNORE_INDEX
    picked = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.where(has_label, labels, 0)[:, None])[:, 0]
    return torch.where(has_label, picked, torch.zeros_like(picked))


def packed_kl_sum(
    logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, ref_logprobs: torch.Tensor
) -> torch.Tensor:
    """Summed k3 estimate of KL(policy || reference) over the loss tokens: exp(r) − r − 1 with r = ref − logp, per
    label token, where ``ref_logprobs`` is label-aligned like the labels (the reference role's log p(labels[t]))."""
    selected = (loss_mask != 0) & (labels != LABEL_IGNORE_INDEX)
    ratio = ref_logprobs.to(torch.float32) - label_logprobs(logits, labels)
    return ((torch.exp(ratio) - ratio - 1) * selected).sum()


class DemoTrainer:
    """Holds a rank's model, optimizer and parallel layout; :meth:`step` trains one mini-batch."""

    def __init__(
        self,
        model: VisionLanguageModel,
        parallelism: Parallelism,
        *,
        learning_rate: float = 1e-2,
        max_grad_norm: float | None = 1.0,
        loss_mask_field: str = "loss_mask",
        kl_coefficient: float = 0.0,
        reference_field: str = "ref_logprobs",
    ) -> None:
        self.model = model
        self.parallelism = parallelism
        self.loss_mask_field = loss_mask_field
        self.max_grad_norm = max_grad_norm
        # With a reference role: the loss adds kl_coefficient × the k3 KL per loss token, on micro-batches that
        # carry its label-aligned log-probs (reference_field)
        self.kl_coefficient = kl_coefficient
        self.reference_field = reference_field
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
        broadcast_parameters(model, parallelism)

    def step(
        self,
        *,
        micro_batches: Iterable[PackedTensors],
        images: ImageSource,
        schedule: EncodingSchedule,
        global_loss_tokens: int,
    ) -> StepResult:
        """Forward, backward, gradient all-reduce, clipping and the optimizer step of one mini-batch."""
        self.optimizer.zero_grad(set_to_none=True)
        result = self.forward_backward(
            micro_batches=micro_batches, images=images, schedule=schedule, global_loss_tokens=global_loss_tokens
        )
        self.optimizer.step()
        logger.debug(
            "rank %d: loss %.4f over %d tokens, grad norm %.3f, %.3fs",
            self.parallelism.rank,
            result.loss,
            result.loss_tokens,
            result.grad_norm,
            result.compute_seconds,
        )
        return result

    def forward_backward(
        self,
        *,
        micro_batches: Iterable[PackedTensors],
        images: ImageSource,
        schedule: EncodingSchedule,
        global_loss_tokens: int,
    ) -> StepResult:
        """Everything but the optimizer step: afterwards every rank holds the summed (and clipped) gradients."""
        if global_loss_tokens < 1:
            raise InvalidArgument("a mini-batch needs at least one loss token", field="global_loss_tokens")
        started = time.perf_counter()
        par = self.parallelism
        iterator = iter(micro_batches)
        totals = {"loss": 0.0, "tokens": 0, "micro_batches": 0, "kl": 0.0}

        def backbone_step(gathered: GatheredEncodings) -> torch.Tensor | None:
            try:
                micro = next(iterator)
            except StopIteration:
                raise FailedPrecondition(
                    f"the schedule has more backbone micro-batches than were delivered ({gathered.micro_batch})",
                    field="micro_batches",
                ) from None
            totals["micro_batches"] += 1
            loss_sum, tokens, kl_sum = self._micro_batch_loss(micro, gathered)
            if loss_sum is None:
                return None
            totals["kl"] += float(kl_sum)
            totals["loss"] += float(loss_sum.detach())
            totals["tokens"] += int(tokens)
            return loss_sum / global_loss_tokens

        _, reuse = train_minibatch(
            encoder=self.model.encoder,
            encoder_inputs=self._encoder_inputs(images),
            backbone_step=backbone_step,
            schedule=schedule,
            transport=par.transport,
        )
        surplus = sum(1 for _ in iterator)  # also lets a TrainerClient mini-batch release its last slot

        parameters = list(self.model.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters])
        # A placeholder cut by a chunk boundary is used in pieces; exactly one piece starts at row 0.
        references = sum(
            1 for micro in schedule.ranks[reuse.rank].backbone_micro_batches for use in micro.uses if use.first_row == 0
        )
        stats = torch.tensor(
            [totals["loss"], totals["tokens"], reuse.encodings_computed, references, surplus, totals["kl"]],
            dtype=torch.float64,
        )
        if par.distributed:
            dist.all_reduce(flat, group=par.reduce_group)
            dist.all_reduce(stats, group=par.reduce_group)
        offset = 0
        for p in parameters:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        loss_sum, tokens, computed, references, surplus_total, kl_sum = stats.tolist()
        if surplus_total:
            raise FailedPrecondition(
                f"{int(surplus_total)} delivered micro-batch(es) were not in the schedule", field="micro_batches"
            )
        if int(tokens) != global_loss_tokens:
            raise FailedPrecondition(
                f"the ranks counted {int(tokens)} loss tokens, the mini-batch has {global_loss_tokens}: the packed "
                "layout and the loss mask disagree",
                field="global_loss_tokens",
            )
        if self.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.max_grad_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(flat))
        return StepResult(
            loss=loss_sum / global_loss_tokens,
            loss_tokens=int(tokens),
            micro_batches=totals["micro_batches"],
            encodings_computed=int(computed),
            encoding_references=int(references),
            grad_norm=grad_norm,
            compute_seconds=time.perf_counter() - started,
            kl=kl_sum / global_loss_tokens,
        )

    def _encoder_inputs(self, images: ImageSource) -> Callable[[EncoderMicroBatch], torch.Tensor]:
        if not isinstance(images, Mapping):
            return images

        def lookup(micro: EncoderMicroBatch) -> torch.Tensor:
            missing = [key for key in micro.keys if key not in images]
            if missing:
                raise FailedPrecondition(
                    f"no image for encoding(s) {missing} on rank {self.parallelism.rank}", field="images"
                )
            return pixels(torch.stack([images[key] for key in micro.keys]))

        return lookup

    def _attention(self, positions: torch.Tensor, cu_seqlens: torch.Tensor) -> AttentionLayout:
        if self.parallelism.cp > 1:
            return context_parallel_attention(positions, cu_seqlens, self.parallelism.cp_group)
        return local_attention(positions, cu_seqlens)

    def _micro_batch_loss(
        self, micro: PackedTensors, gathered: GatheredEncodings
    ) -> tuple[torch.Tensor | None, torch.Tensor, float]:
        """(summed loss, loss tokens, summed KL) of one micro-batch; the loss includes the weighted KL."""
        input_ids = micro["input_ids"].to(torch.int64)
        if input_ids.numel() == 0:  # an empty micro-batch (the same on every CP rank): nothing to run
            return None, torch.zeros((), dtype=torch.int64), 0.0
        positions = micro["position_ids"].to(torch.int64)
        logits = self.model.backbone(
            input_ids,
            position_ids=positions,
            features=gathered.features,
            feature_positions=gathered.positions,
            attention=self._attention(positions, micro["cu_seqlens"]),
        )
        labels, loss_mask = micro["labels"].to(torch.int64), micro[self.loss_mask_field]
        loss_sum, tokens = packed_loss_sum(logits, labels, loss_mask)
        if not self.kl_coefficient or self.reference_field not in micro:
            return loss_sum, tokens, 0.0
        # A copy: the micro-batch's tensors may live in a shared-memory slot that is reused after this call.
        kl_sum = packed_kl_sum(logits, labels, loss_mask, micro[self.reference_field].clone())
        return loss_sum + self.kl_coefficient * kl_sum, tokens, float(kl_sum.detach())


def images_from_encoder_minibatch(mini: Iterable[Any]) -> dict[UnitKey, torch.Tensor]:
    """The images of an encoder consumer's ``TrainerClient`` mini-batch, copied out of shared memory (the views
    die when the iterator moves on), keyed by unit key."""
    images: dict[UnitKey, torch.Tensor] = {}
    for micro in mini:
        assignments = micro.encoder_inputs
        if not assignments:
            continue
        if "inputs" in micro:
            batch = micro["inputs"]
            rows = [batch[k] for k in range(len(assignments))]
        else:
            rows = [micro[f"inputs.{k}"] for k in range(len(assignments))]
        for assignment, image in zip(assignments, rows, strict=True):
            images[UnitKey(assignment.encoding.key)] = image.clone()
    return images


def step_on_trainer_minibatch(trainer: DemoTrainer, mini: Any, *, encoder_mini: Any = None) -> StepResult:
    """One optimizer step on ``TrainerClient`` mini-batches of the same admitted mini-batch: ``mini`` from this
    rank's backbone sidecar and, on ranks that compute encodings (global rank d < encoder dp), ``encoder_mini``
    from the encoder sidecar of encoder DP rank d. The encoding schedule is gathered from every rank's
    assignments (:mod:`knittrans.demo.schedule_exchange`), so the assignment source need not send full plans;
    every rank of the world must call this for every mini-batch."""
    par = trainer.parallelism
    encoder_micro_batches = ()
    images: dict[UnitKey, torch.Tensor] = {}
    if encoder_mini is not None:
        if encoder_mini.sequence != mini.sequence:
            raise FailedPrecondition(
                f"the encoder sidecar is at mini-batch {encoder_mini.sequence}, the backbone one at {mini.sequence}",
                field="encoder_mini",
            )
        encoder_micro_batches = encoder_mini.assignment.encoder_microbatches
        images = images_from_encoder_minibatch(encoder_mini)
    part = rank_part(
        dp_rank=par.dp_rank,
        cp_rank=par.cp_rank,
        backbone_uses=mini.encoding_uses,
        encoder_micro_batches=encoder_micro_batches,
    )
    schedule = (
        exchange_encoding_schedule(part, group=par.reduce_group) if par.distributed else schedule_from_parts([part])
    )
    waited = [0.0]

    def micro_batches() -> Iterator[Any]:
        for micro in mini:
            waited[0] += micro.waited_seconds
            yield micro

    result = trainer.step(
        micro_batches=micro_batches(), images=images, schedule=schedule, global_loss_tokens=mini.global_loss_tokens
    )
    return replace(result, data_wait_seconds=waited[0])
