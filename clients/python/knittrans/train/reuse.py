"""Mini-batch-wide reuse of multimodal encodings with exact gradients (the paper's §5.3, Listing 1).

For one mini-batch, every rank runs four phases in order:

1. :meth:`MinibatchEncodingReuse.encode` — the encoder forward over the rank's own encoder micro-batches,
   keeping the graphs. Every output is checked against the schedule; all ranks agree that every rank
   passed before anything moves.
2. :meth:`MinibatchEncodingReuse.distribute` — each encoding travels detached from its owner to every
   consumer in its route and is cached there for the mini-batch.
3. :meth:`MinibatchEncodingReuse.run_backbone` — per backbone micro-batch, the needed rows are gathered as
   a fresh leaf tensor that requires grad, the caller's step runs forward and backward (which stops at
   that leaf), the leaf's gradient is added into a per-row accumulator with ``index_add_`` and the leaf is
   dropped at once.
4. :meth:`MinibatchEncodingReuse.backward_encoder` — each consumer returns its accumulated gradient along
   the reverse route, only the rows its TP rank owns (row i belongs to TP rank ``i % tp_size``); owners
   sum the contributions and run one deferred backward through all retained encoder graphs.

Every message is laid out by :meth:`EncodingSchedule.wire`, which sender and receiver both call; receivers
find an encoding's rows by key in that layout.

Then the caller reduces gradients across data-parallel ranks as usual and steps the optimizer.
:func:`train_minibatch` runs the four phases. Gradients equal those of the duplicated path (every
trajectory encodes its own copy) up to float rounding, because the gradient of a sum of consumers is the
sum of their gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from knittrans.errors import FailedPrecondition, InvalidArgument, KnitTransError
from knittrans.train.encoder_checks import check_encoder_supported
from knittrans.train.schedule import EncoderMicroBatch, EncodingSchedule, EncodingUse, WireKind, WireLayout
from knittrans.train.transport import ReceiveSpec, Transport, default_transport
from knittrans.types import UnitKey

logger = logging.getLogger(__name__)

_DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4}
_DTYPES_BY_CODE = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_NO_ENCODINGS = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class GatheredEncodings:
    """What the backbone step of one micro-batch receives.

    ``features[j]`` fills placeholder token ``positions[j]`` of the micro-batch's local token layout.
    ``features`` is a leaf that requires grad; the backbone backward stops there.
    """

    micro_batch: int
    features: torch.Tensor
    positions: torch.Tensor
    uses: tuple[EncodingUse, ...]

    def insert_into(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` (tokens, dim) with the placeholder rows replaced by the encodings (out of place)."""
        return hidden.index_put((self.positions,), self.features.to(hidden.dtype))


BackboneStep = Callable[[GatheredEncodings], "torch.Tensor | None"]
"""Runs one backbone micro-batch. Returns its (already normalised) loss, on which the helper calls
``backward()``, or None after running backward itself (for instance through a gradient scaler)."""

EncoderInputs = Callable[[EncoderMicroBatch], Any]
"""Returns the encoder's input for one encoder micro-batch; a tuple is passed as positional arguments."""


class Phase(StrEnum):
    NEW = "new"
    ENCODED = "encoded"
    DISTRIBUTED = "distributed"
    BACKBONE_DONE = "backbone_done"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class EncodingReuseReport:
    """What one rank did in one mini-batch."""

    rank: int
    encodings_computed: int
    encodings_cached: int
    uses: int
    rows_sent: int
    rows_received: int
    gradient_rows_sent: int
    gradient_rows_received: int


def _split_encoder_output(output: Any, micro: EncoderMicroBatch, rows: Sequence[int]) -> list[torch.Tensor]:
    """Per-key tensors from (keys, rows, hidden), packed (sum rows, hidden), or a sequence of (rows, hidden)."""
    if isinstance(output, torch.Tensor):
        if output.dim() == 3:
            if output.shape[0] != len(micro.keys):
                raise FailedPrecondition(
                    f"encoder returned {output.shape[0]} encodings for {len(micro.keys)} keys", field="encoder"
                )
            return list(output.unbind(0))
        if output.dim() == 2:
            if output.shape[0] != sum(rows):
                raise FailedPrecondition(
                    f"encoder returned {output.shape[0]} packed rows; the schedule expects {sum(rows)} "
                    f"for keys {list(micro.keys)}",
                    field="encoder",
                )
            return list(output.split(list(rows), dim=0))
        raise FailedPrecondition(
            f"encoder output has shape {tuple(output.shape)}; expected (keys, rows, hidden) or (rows, hidden)",
            field="encoder",
        )
    if isinstance(output, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in output):
        if len(output) != len(micro.keys):
            raise FailedPrecondition(
                f"encoder returned {len(output)} encodings for {len(micro.keys)} keys", field="encoder"
            )
        return list(output)
    raise FailedPrecondition(f"encoder returned {type(output).__name__}, not tensors", field="encoder")


class MinibatchEncodingReuse:
    """One mini-batch of encoding reuse on one rank; run the phases in order (see the module docstring)."""

    def __init__(
        self,
        *,
        encoder: nn.Module,
        encoder_inputs: EncoderInputs,
        schedule: EncodingSchedule,
        transport: Transport | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self._encoder = encoder
        self._encoder_inputs = encoder_inputs
        self._schedule = schedule
        self._transport = transport if transport is not None else default_transport()
        if device is None:
            parameter = next(encoder.parameters(), None)
            device = parameter.device if parameter is not None else torch.device("cpu")
        self._device = torch.device(device)
        self._phase = Phase.NEW
        self._outputs: dict[UnitKey, torch.Tensor] = {}
        self._hidden = 0
        self._dtype = torch.float32
        self._cache: torch.Tensor | None = None
        self._cache_grad: torch.Tensor | None = None
        self._offsets: dict[UnitKey, int] = {}
        self._rows_sent = self._rows_received = 0
        self._grad_rows_sent = self._grad_rows_received = 0

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def grad_dtype(self) -> torch.dtype:
        """Gradients of 16-bit encodings accumulate in float32, like parameter gradients usually do."""
        return torch.float32 if self._dtype in (torch.float16, torch.bfloat16) else self._dtype

    def _enter(self, expected: Phase, name: str) -> None:
        if self._phase is not expected:
            raise FailedPrecondition(f"{name}() needs phase {expected.value}, the run is in phase {self._phase.value}")

    def _agree(self, check: str, error: Exception | None, extra: Sequence[int] = ()) -> list[tuple[int, ...]]:
        """All ranks learn whether any rank failed ``check``; every rank then raises or none does.

        Without this, a rank that raised alone would leave its peers blocked in the next exchange.
        """
        gathered = self._transport.all_gather_ints([1 if error is not None else 0, *extra])
        failed = [rank for rank, values in enumerate(gathered) if values[0]]
        if error is not None:
            self._phase = Phase.FAILED
            raise error
        if failed:
            self._phase = Phase.FAILED
            raise FailedPrecondition(f"rank(s) {failed} failed the {check} check; see the error raised there")
        return [values[1:] for values in gathered]

    # Phase 1 -----------------------------------------------------------------------------------------

    def _preflight(self) -> None:
        error: Exception | None = None
        try:
            if self._schedule.world_size != self._transport.world_size:
                raise InvalidArgument(
                    f"the schedule has {self._schedule.world_size} ranks, the process group "
                    f"{self._transport.world_size}",
                    field="schedule.ranks",
                )
            check_encoder_supported(self._encoder)
        except KnitTransError as exc:
            error = exc
        digest = bytes.fromhex(self._schedule.fingerprint())
        words = [int.from_bytes(digest[i : i + 4], "big") for i in range(0, len(digest), 4)]
        fingerprints = self._agree("schedule and encoder", error, words)
        if any(f != fingerprints[0] for f in fingerprints):
            self._phase = Phase.FAILED
            differing = [rank for rank, f in enumerate(fingerprints) if f != fingerprints[0]]
            raise FailedPrecondition(f"ranks disagree on the schedule: rank(s) {differing} differ from rank 0")

    def encode(self) -> None:
        """Encoder forward over this rank's encoder micro-batches, graphs kept; validates every output."""
        self._enter(Phase.NEW, "encode")
        self._preflight()
        rank = self._schedule.ranks[self.rank]
        error: Exception | None = None
        hidden, dtype = 0, None
        try:
            for m, micro in enumerate(rank.encoder_micro_batches):
                rows = [self._schedule.route(key).num_rows for key in micro.keys]
                inputs = self._encoder_inputs(micro)
                output = self._encoder(*inputs) if isinstance(inputs, tuple) else self._encoder(inputs)
                for key, expected_rows, tensor in zip(
                    micro.keys, rows, _split_encoder_output(output, micro, rows), strict=True
                ):
                    path = f"encoder_micro_batches[{m}] key {key!r}"
                    if tensor.dim() != 2 or tensor.shape[0] != expected_rows:
                        raise FailedPrecondition(
                            f"{path}: encoding has shape {tuple(tensor.shape)}, the schedule expects "
                            f"({expected_rows}, hidden)",
                            field="encoder",
                        )
                    if tensor.dtype not in _DTYPE_CODES:
                        raise FailedPrecondition(f"{path}: unsupported dtype {tensor.dtype}", field="encoder")
                    if dtype is None:
                        hidden, dtype = tensor.shape[1], tensor.dtype
                    elif (tensor.shape[1], tensor.dtype) != (hidden, dtype):
                        raise FailedPrecondition(
                            f"{path}: hidden size {tensor.shape[1]} ({tensor.dtype}) differs from earlier "
                            f"encodings ({hidden}, {dtype})",
                            field="encoder",
                        )
                    self._outputs[key] = tensor
        except Exception as exc:  # any failure must reach the agreement, or peers would wait forever
            error = exc
        code = _DTYPE_CODES[dtype] if dtype is not None else _NO_ENCODINGS
        shapes = self._agree("encoder output", error, [hidden, code])
        owners = [(h, c) for h, c in shapes if c != _NO_ENCODINGS]
        if len(set(owners)) > 1:
            self._phase = Phase.FAILED
            raise FailedPrecondition(f"encoder ranks disagree on (hidden size, dtype code): {sorted(set(owners))}")
        if owners:
            self._hidden, self._dtype = owners[0][0], _DTYPES_BY_CODE[owners[0][1]]
        self._phase = Phase.ENCODED

    # Phase 2 -----------------------------------------------------------------------------------------

    def distribute(self) -> None:
        """Route every encoding detached to its consumers and build this rank's cache."""
        self._enter(Phase.ENCODED, "distribute")
        schedule, me = self._schedule, self.rank
        peers = [rank for rank in range(schedule.world_size) if rank != me]
        sends: dict[int, torch.Tensor] = {}
        receives: dict[int, ReceiveSpec] = {}
        incoming: dict[int, WireLayout] = {}
        for peer in peers:
            outgoing = schedule.wire(owner=me, consumer=peer, kind=WireKind.ENCODINGS)
            if outgoing.segments:
                sends[peer] = torch.cat([self._outputs[segment.key].detach() for segment in outgoing.segments])
                self._rows_sent += sends[peer].shape[0]
            layout = schedule.wire(owner=peer, consumer=me, kind=WireKind.ENCODINGS)
            if layout.segments:
                incoming[peer] = layout
                receives[peer] = ReceiveSpec(shape=(layout.num_rows, self._hidden), dtype=self._dtype)
                self._rows_received += layout.num_rows
        received = self._transport.exchange(sends, receives, self._device)
        del sends

        pieces: list[torch.Tensor] = []
        offset = 0
        for key in schedule.consumed_keys(me):
            route = schedule.route(key)
            if route.owner == me:
                piece = self._outputs[key].detach()
            else:
                segment = incoming[route.owner].segment(key)
                piece = received[route.owner][segment.start : segment.start + segment.num_rows]
            self._offsets[key] = offset
            offset += route.num_rows
            pieces.append(piece.to(self._device))
        self._cache = (
            torch.cat(pieces) if pieces else torch.empty((0, self._hidden), dtype=self._dtype, device=self._device)
        )
        del pieces, received

        error: Exception | None = None
        for m, micro in enumerate(schedule.ranks[me].backbone_micro_batches):
            for u, use in enumerate(micro.uses):
                if use.key not in self._offsets:
                    error = FailedPrecondition(
                        f"encoding {use.key!r} is missing from the cache of rank {me}",
                        field=f"backbone_micro_batches[{m}].uses[{u}].key",
                    )
        self._agree("encoding cache", error)
        self._phase = Phase.DISTRIBUTED

    # Phase 3 -----------------------------------------------------------------------------------------

    def _gather_indices(self, uses: Sequence[EncodingUse]) -> tuple[torch.Tensor, torch.Tensor]:
        if not uses:
            empty = torch.empty(0, dtype=torch.long, device=self._device)
            return empty, empty
        rows = torch.cat(
            [
                torch.arange(self._offsets[u.key] + u.first_row, self._offsets[u.key] + u.end_row, device=self._device)
                for u in uses
            ]
        )
        positions = torch.cat([torch.arange(u.position, u.end_position, device=self._device) for u in uses])
        return rows, positions

    def run_backbone(self, backbone_step: BackboneStep) -> list[torch.Tensor | None]:
        """Every backbone micro-batch of this rank; returns their detached losses (None where not returned)."""
        self._enter(Phase.DISTRIBUTED, "run_backbone")
        assert self._cache is not None
        self._phase = Phase.FAILED  # until the loop completes
        cache_grad = torch.zeros(self._cache.shape, dtype=self.grad_dtype, device=self._device)
        losses: list[torch.Tensor | None] = []
        for m, micro in enumerate(self._schedule.ranks[self.rank].backbone_micro_batches):
            rows, positions = self._gather_indices(micro.uses)
            features = self._cache.index_select(0, rows).requires_grad_(True)
            loss = backbone_step(
                GatheredEncodings(micro_batch=m, features=features, positions=positions, uses=micro.uses)
            )
            if loss is not None:
                loss.backward()
                losses.append(loss.detach())
            else:
                losses.append(None)
            if features.grad is not None:
                cache_grad.index_add_(0, rows, features.grad.to(self.grad_dtype))
            # The micro-batch-local copy and its gradient are dead now; free them before the next one.
            del features, loss
        self._cache_grad = cache_grad
        self._phase = Phase.BACKBONE_DONE
        return losses

    # Phase 4 -----------------------------------------------------------------------------------------

    def _key_rows(self, cache_grad: torch.Tensor, key: UnitKey) -> torch.Tensor:
        start = self._offsets[key]
        return cache_grad[start : start + self._schedule.route(key).num_rows]

    def _owned_rows(self, rank: int, grad_rows: torch.Tensor) -> torch.Tensor:
        """The rows ``rank`` returns: row i belongs to TP rank i mod tp_size."""
        return grad_rows[self._schedule.ranks[rank].tp_rank :: self._schedule.tp_size]

    def backward_encoder(self) -> None:
        """Return gradients along the reverse route, sum them at the owners, one deferred encoder backward."""
        self._enter(Phase.BACKBONE_DONE, "backward_encoder")
        assert self._cache_grad is not None
        schedule, me = self._schedule, self.rank
        cache_grad = self._cache_grad
        peers = [rank for rank in range(schedule.world_size) if rank != me]
        sends: dict[int, torch.Tensor] = {}
        receives: dict[int, ReceiveSpec] = {}
        incoming: dict[int, WireLayout] = {}
        for peer in peers:
            outgoing = schedule.wire(owner=peer, consumer=me, kind=WireKind.GRADIENTS)
            if outgoing.segments:
                sends[peer] = torch.cat(
                    [self._owned_rows(me, self._key_rows(cache_grad, segment.key)) for segment in outgoing.segments]
                )
                self._grad_rows_sent += sends[peer].shape[0]
            layout = schedule.wire(owner=me, consumer=peer, kind=WireKind.GRADIENTS)
            if layout.segments:
                incoming[peer] = layout
                receives[peer] = ReceiveSpec(shape=(layout.num_rows, self._hidden), dtype=self.grad_dtype)
                self._grad_rows_received += layout.num_rows
        local = {key: self._key_rows(cache_grad, key) for key in schedule.keys_between(me, me)}
        self._cache = self._cache_grad = None
        del cache_grad
        received = self._transport.exchange(sends, receives, self._device)
        del sends

        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        # Any order works here: each consumer's rows are found by key in the layout both ends derived.
        for key in schedule.ranks[me].owned_keys:
            route = schedule.route(key)
            output = self._outputs[key]
            if route.consumers == (me,) and schedule.tp_size == 1:
                total = local[key]
            else:
                total = torch.zeros((route.num_rows, self._hidden), dtype=self.grad_dtype, device=self._device)
                for consumer in route.consumers:  # ascending rank order: a fixed summation order
                    if consumer == me:
                        part = self._owned_rows(me, local[key])
                    else:
                        segment = incoming[consumer].segment(key)
                        part = received[consumer][segment.start : segment.start + segment.num_rows]
                    total[schedule.ranks[consumer].tp_rank :: schedule.tp_size] += part
            if output.requires_grad:
                roots.append(output)
                grads.append(total.to(output.dtype))
        del local, received
        if roots:
            torch.autograd.backward(roots, grads)
        self._outputs.clear()
        self._phase = Phase.FINISHED

    def report(self) -> EncodingReuseReport:
        rank = self._schedule.ranks[self.rank]
        return EncodingReuseReport(
            rank=self.rank,
            encodings_computed=len(rank.owned_keys),
            encodings_cached=len(self._offsets),
            uses=sum(len(micro.uses) for micro in rank.backbone_micro_batches),
            rows_sent=self._rows_sent,
            rows_received=self._rows_received,
            gradient_rows_sent=self._grad_rows_sent,
            gradient_rows_received=self._grad_rows_received,
        )


def train_minibatch(
    *,
    encoder: nn.Module,
    encoder_inputs: EncoderInputs,
    backbone_step: BackboneStep,
    schedule: EncodingSchedule,
    transport: Transport | None = None,
    device: torch.device | str | None = None,
) -> tuple[list[torch.Tensor | None], EncodingReuseReport]:
    """Forward and backward of one mini-batch with each unique encoding computed once.

    Leaves the gradients in ``encoder`` and the backbone's parameters; the caller then reduces them across
    data-parallel ranks and steps the optimizer. Returns the backbone losses and this rank's report.
    """
    run = MinibatchEncodingReuse(
        encoder=encoder, encoder_inputs=encoder_inputs, schedule=schedule, transport=transport, device=device
    )
    run.encode()
    run.distribute()
    losses = run.run_backbone(backbone_step)
    run.backward_encoder()
    report = run.report()
    logger.debug("rank %d encoded %d unique inputs for %d uses", report.rank, report.encodings_computed, report.uses)
    return losses, report
