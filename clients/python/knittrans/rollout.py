"""Rollout-side writes (DESIGN.md §2 step 1): split a finished trajectory into atomic units and store them.

:meth:`RolloutClient.submit` takes a dict of numpy arrays or torch tensors plus the trajectory's
metadata, writes its units through a :class:`~knittrans.store.protocol.UnitStore` in batches, and
returns the typed :class:`~knittrans.types.TrajectoryMeta` that the admission service receives. With a
``reporter`` it also hands the metadata over; without one it only returns it.

Splitting:

* ``tokens_field`` (default ``input_ids``) fixes the trajectory length L;
* every array whose leading axis has length L is a per-token unit (sliceable by CP ranges), unless it
  is named in ``non_sequence_fields``; other arrays are non-sequence units, read whole;
* Python numbers and 0-d arrays are scalars (reward, advantage, ...) and travel in the metadata;
  ``int_scalars`` and ``bool_scalars`` are integer and boolean ones (packed as int64 and bool tensors), and
  ``metadata`` maps names to ``str``, ``bytes`` or JSON-serialisable values (verl's ``uid``, ``data_source``,
  ground truth): small values that reach the trainer beside each micro-batch (:mod:`knittrans.values`);
* ``field_alignment`` says, for per-target fields (loss mask, log-probs, per-token advantages, ...), whether
  position t describes token t itself (``token``: verl's ``response_mask``, slime's ``loss_masks``) or the
  prediction of token t+1 (``label``). The trainer receives every such field label-aligned, like ``labels``
  (the reorg sidecar shifts token-aligned ones); fields not named there are inputs, packed as stored. The loss
  mask (``loss_mask_field``) is token-aligned unless declared otherwise;
* ``response_fields`` are per-token fields that cover only the response, tokens ``[response_start, num_tokens)``
  (verl's ``old_log_probs`` and ``advantages``, slime's ``rollout_log_probs``): their leading axis has length
  ``num_tokens - response_start`` and row j describes token ``response_start + j``. They may have an alignment
  like any per-token field; the sidecar packs them with 0 over the prompt and a ``<name>.mask`` (see
  docs/integration.md, "Response-only fields");
* ``num_loss_tokens`` counts exactly the positions the loss uses: those with a label (every token but the
  last) whose label-aligned mask is non-zero (all of them without a mask);
* each multimodal input (one image, or one group of consecutive video frames) is one unit keyed by
  the sample id and its content hash, stored once per sample however many trajectories share it (the
  store finds the key present and skips it).

A trajectory relies on a multimodal unit from the moment its write finds the unit present, not from its
report: were a sibling's release to delete the unit in between, the trajectory would be admitted without
its image. So when the reporter can reserve units (:class:`UnitReserver`; the admission client and
:class:`~knittrans.client.reporter.BatchingReporter` can), ``submit`` reserves all of a trajectory's units
(its own and the multimodal ones) with the admission service before writing them, and the report takes the
reservation over. A reporter that reports by other means must reserve the same way (the ``ReserveUnits`` RPC)
before writing. A reservation never taken over (the worker died between writing and reporting) expires after
the service's ``unreported_unit_ttl_seconds``, and the service deletes its units then.

Everything is validated before the first byte is written. If the store fails part-way, the units this
call created are removed again (multimodal units excepted: a sibling trajectory may already reference
them; they are released with their sample), so a failed submit can simply be retried.

If the admission service rejects a trajectory (a reporter whose ``report`` takes ``discard=``, such as
:class:`~knittrans.client.reporter.BatchingReporter`, says which; the admission client itself raises the
rejection), its units are removed from the store and its reservation is cancelled, so the service deletes the
multimodal units that nothing else references. A conflict (the id was reported before with other content)
raises :class:`~knittrans.errors.Conflict` and removes nothing.

These I/O steps are :mod:`knittrans.submission`'s, shared with :class:`~knittrans.aio.AsyncRolloutClient`, the
same client for asyncio rollout servers.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from knittrans.blocking import run_to_completion
from knittrans.client.model import ReportResult
from knittrans.errors import InvalidArgument
from knittrans.reservations import ReserveResult, UnitReservation
from knittrans.store.arrays import to_numpy
from knittrans.store.keys import check_simple_name, multimodal_unit_key, trajectory_unit_key
from knittrans.store.protocol import UnitStore, UnitWrite
from knittrans.submission import Discard, QueuedDespiteEarlierFailure, discard_rejected, store_and_report
from knittrans.submitted_values import checked_values, is_scalar, response_field_names, scalar_value
from knittrans.types import (
    Coverage,
    FieldAlignment,
    MultimodalRef,
    SampleId,
    SourceName,
    TokenSpan,
    TrajectoryId,
    TrajectoryMeta,
    UnitKey,
    UnitKind,
    UnitRef,
    VersionSegment,
    check_id,
)

logger = logging.getLogger(__name__)

DEFAULT_BATCH_BYTES = 256 << 20
# Multimodal keys remembered for clean-up after a rejection; an older one is assumed to be in use and kept.


class Closeable(Protocol):
    def close(self) -> None: ...


class MetadataReporter(Protocol):
    """Receives the metadata of stored trajectories (the admission client implements it)."""

    def report(self, trajectories: Sequence[TrajectoryMeta]) -> object: ...


class RejectionReporter(Protocol):
    """A reporter that hands back the trajectories the service rejects, so their units can be removed."""

    def report(
        self, trajectories: Sequence[TrajectoryMeta], *, discard: Callable[[Sequence[TrajectoryMeta]], None]
    ) -> None: ...


@runtime_checkable
class UnitReserver(Protocol):
    """Reserves shared units before they are written, and cancels reservations of failed submits."""

    def reserve_units(self, reservations: Sequence[UnitReservation]) -> ReserveResult: ...

    def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> object: ...


@dataclass(frozen=True, kw_only=True, eq=False)
class MultimodalInput:
    """One image, or one group of consecutive video frames, consumed at ``placeholder`` by ``encoder``."""

    data: Any  # numpy array or torch tensor
    encoder: str
    cost: float
    placeholder: TokenSpan
    kind: UnitKind = UnitKind.IMAGE

    def __post_init__(self) -> None:
        check_id(self.encoder, "encoder")
        if not isinstance(self.placeholder, TokenSpan):
            raise InvalidArgument("must be a TokenSpan", field="placeholder")
        if self.kind not in (UnitKind.IMAGE, UnitKind.VIDEO):
            raise InvalidArgument("must be image or video", field="kind")
        if not (isinstance(self.cost, Real) and math.isfinite(self.cost) and self.cost > 0):
            raise InvalidArgument(f"must be a positive finite number, got {self.cost!r}", field="cost")


@dataclass(frozen=True, kw_only=True, eq=False)
class Trajectory:
    """One finished trajectory as a rollout worker has it: named arrays plus metadata."""

    trajectory_id: str
    sample_id: str
    source: str
    rollout_step: int
    segments: Sequence[VersionSegment]
    fields: Mapping[str, Any]
    multimodal: Sequence[MultimodalInput] = ()
    scalars: Mapping[str, float] = field(default_factory=dict)
    int_scalars: Mapping[str, int] = field(default_factory=dict)
    bool_scalars: Mapping[str, bool] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # str, bytes, MetadataValue or JSON-serialisable
    accepted: bool = True
    finished_at: float | None = None
    tokens_field: str = "input_ids"
    loss_mask_field: str | None = "loss_mask"
    non_sequence_fields: Collection[str] = ()
    # Per-target field -> FieldAlignment (or its value); the loss mask defaults to token-aligned.
    field_alignment: Mapping[str, FieldAlignment | str] = field(default_factory=dict)
    response_start: int = 0  # the first response token; tokens before it are the prompt
    response_fields: Collection[str] = ()  # per-token fields over [response_start, num_tokens) only


@dataclass(frozen=True, kw_only=True)
class _Split:
    meta: TrajectoryMeta
    writes: tuple[UnitWrite, ...]


class BlockingSubmitIO:
    """The sync client's :class:`~knittrans.submission.SubmitIO`: every call blocks, none suspends."""

    def __init__(self, store: UnitStore, reporter: MetadataReporter | None, *, discard: Discard) -> None:
        self._store = store
        self._reporter = reporter
        self._discard = discard
        self._reports_rejections = reporter is not None and "discard" in inspect.signature(reporter.report).parameters
        self._reserver = reporter if isinstance(reporter, UnitReserver) else None

    async def reserve_units(self, reservations: Sequence[UnitReservation]) -> frozenset[TrajectoryId]:
        if self._reserver is None:
            return frozenset()
        return self._reserver.reserve_units(reservations).already_reported

    async def cancel_reservations(self, trajectory_ids: Sequence[TrajectoryId]) -> None:
        if self._reserver is not None:
            self._reserver.cancel_reservations(trajectory_ids)

    async def put_many(self, writes: Sequence[UnitWrite], created: list[UnitKey]) -> None:
        created.extend(self._store.put_many(writes).created)

    async def delete_many(self, keys: Sequence[UnitKey]) -> None:
        self._store.delete_many(keys)

    async def report(self, metas: Sequence[TrajectoryMeta]) -> list[ReportResult] | None:
        if self._reporter is None:
            return None
        if self._reports_rejections:
            try:
                cast(RejectionReporter, self._reporter).report(metas, discard=self._discard)
            except InvalidArgument as error:  # queued all the same: an earlier report's, or discarded already
                raise QueuedDespiteEarlierFailure(error) from error
            return None
        results = self._reporter.report(metas)  # the admission client's: one result per trajectory
        return [r for r in results if isinstance(r, ReportResult)] if isinstance(results, list) else None


class RolloutClient:
    """Writes trajectories' units to a unit store and returns (and optionally reports) their metadata."""

    def __init__(
        self,
        store: UnitStore,
        *,
        namespace: str = "default",
        reporter: MetadataReporter | None = None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        clock: Callable[[], float] = time.time,
        closes: Sequence[Closeable] = (),
    ) -> None:
        """``closes``: what :meth:`close` closes, in order (what :meth:`from_env` opened for this client)."""
        check_simple_name(namespace, "namespace")
        if not isinstance(batch_bytes, int) or batch_bytes < 1:
            raise InvalidArgument(f"must be a positive integer, got {batch_bytes!r}", field="batch_bytes")
        self._store = store
        self._namespace = namespace
        self._reporter = reporter
        self._batch_bytes = batch_bytes
        self._clock = clock
        self._io = BlockingSubmitIO(store, reporter, discard=self._discard_rejected)
        self._closes = tuple(closes)

    @classmethod
    def from_env(cls, *, namespace: str = "default", connection_file: str | Path | None = None,
                 wait_seconds: float = 60.0, **options: Any) -> RolloutClient:
        """A client of the stack ``knittrans up`` runs, from its connection file (:mod:`knittrans.connect`):
        units go to the stack's store and reports to its admission service. Close it (or use ``with``) to flush
        the reports."""
        from knittrans.connect import rollout_client

        return rollout_client(connection_file, namespace=namespace, wait_seconds=wait_seconds, **options)

    def close(self) -> None:
        """Close what this client owns (nothing unless built by :meth:`from_env`): a batching reporter is
        flushed first, so every trajectory submitted is acknowledged when this returns."""
        closes, self._closes = self._closes, ()
        for resource in closes:
            resource.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def store(self) -> UnitStore:
        return self._store

    def submit(
        self,
        fields: Mapping[str, Any],
        *,
        trajectory_id: str,
        sample_id: str,
        source: str,
        rollout_step: int,
        segments: Sequence[VersionSegment],
        multimodal: Sequence[MultimodalInput] = (),
        scalars: Mapping[str, float] | None = None,
        int_scalars: Mapping[str, int] | None = None,
        bool_scalars: Mapping[str, bool] | None = None,
        metadata: Mapping[str, Any] | None = None,
        accepted: bool = True,
        finished_at: float | None = None,
        tokens_field: str = "input_ids",
        loss_mask_field: str | None = "loss_mask",
        non_sequence_fields: Collection[str] = (),
        field_alignment: Mapping[str, FieldAlignment | str] | None = None,
        response_start: int = 0,
        response_fields: Collection[str] = (),
    ) -> TrajectoryMeta:
        """Store one trajectory's units; returns its metadata (reported first when a reporter is set).

        ``field_alignment`` maps per-target fields to ``"token"`` (position t describes token t: verl's and
        slime's masks and log-probs) or ``"label"`` (position t describes the prediction of token t+1); the
        loss mask is ``"token"`` unless named. ``response_fields`` hold only tokens ``[response_start,
        num_tokens)``. See the module docstring and docs/integration.md."""
        trajectory = Trajectory(
            trajectory_id=trajectory_id,
            sample_id=sample_id,
            source=source,
            rollout_step=rollout_step,
            segments=segments,
            fields=fields,
            multimodal=multimodal,
            scalars=scalars or {},
            int_scalars=int_scalars or {},
            bool_scalars=bool_scalars or {},
            metadata=metadata or {},
            accepted=accepted,
            finished_at=finished_at,
            tokens_field=tokens_field,
            loss_mask_field=loss_mask_field,
            non_sequence_fields=non_sequence_fields,
            field_alignment=field_alignment or {},
            response_start=response_start,
            response_fields=response_fields,
        )
        return self.submit_many([trajectory])[0]

    def flush(self) -> None:
        """Return once every submitted trajectory is reported (a batching reporter sends what it holds; one that
        reports as it goes has nothing to do)."""
        flush = getattr(self._reporter, "flush", None)
        if callable(flush):
            flush()

    def submit_many(self, trajectories: Sequence[Trajectory]) -> list[TrajectoryMeta]:
        """Store several trajectories with shared batches; all are validated before anything is written."""
        metas, writes = self.split_many(trajectories)
        run_to_completion(store_and_report(metas, writes, self._io, batch_bytes=self._batch_bytes))
        return metas

    def split_many(self, trajectories: Sequence[Trajectory]) -> tuple[list[TrajectoryMeta], list[UnitWrite]]:
        """Validate and split trajectories into their metadata and their unit writes; writes nothing (the
        :class:`~knittrans.aio.AsyncRolloutClient` splits with it, off the event loop)."""
        splits = [self._split(trajectory, index) for index, trajectory in enumerate(trajectories)]
        seen: set[str] = set()
        for index, split in enumerate(splits):
            if split.meta.trajectory_id in seen:
                raise InvalidArgument("appears twice in one submit", field=f"trajectories[{index}].trajectory_id")
            seen.add(split.meta.trajectory_id)
        return [split.meta for split in splits], [w for split in splits for w in split.writes]

    def _discard_rejected(self, metas: Sequence[TrajectoryMeta]) -> None:
        """The ``discard`` callback of a batching reporter (see :func:`~knittrans.submission.discard_rejected`)."""
        run_to_completion(discard_rejected(metas, self._io))

    # -- splitting ----------------------------------------------------------------------------------

    def _split(self, trajectory: Trajectory, index: int) -> _Split:
        try:
            return self._split_one(trajectory)
        except InvalidArgument as exc:
            where = f"trajectories[{index}]"
            raise InvalidArgument(exc.message, field=f"{where}.{exc.field}" if exc.field else where) from exc

    def _split_one(self, trajectory: Trajectory) -> _Split:
        trajectory_id = TrajectoryId(trajectory.trajectory_id)
        sample_id = SampleId(trajectory.sample_id)
        check_id(trajectory_id, "trajectory_id")
        check_id(sample_id, "sample_id")
        if not isinstance(trajectory.fields, Mapping):
            raise InvalidArgument("must be a mapping of field names to arrays", field="fields")
        if trajectory.tokens_field not in trajectory.fields:
            raise InvalidArgument("is missing from the fields", field=f"fields.{trajectory.tokens_field}")
        for name in trajectory.non_sequence_fields:
            if name not in trajectory.fields:
                raise InvalidArgument("is not one of the fields", field=f"non_sequence_fields.{name}")

        scalars: dict[str, float] = {}
        for name, value in trajectory.scalars.items():
            scalars[name] = scalar_value(value, field=f"scalars.{name}")
        arrays: dict[str, tuple[np.ndarray, Any]] = {}
        for name, value in trajectory.fields.items():
            check_simple_name(name, f"fields.{name}")
            if is_scalar(value):
                if name in scalars:
                    raise InvalidArgument("is both a field and a scalar", field=f"fields.{name}")
                scalars[name] = scalar_value(value, field=f"fields.{name}")
            else:
                arrays[name] = to_numpy(value, field=f"fields.{name}")

        if trajectory.tokens_field not in arrays or arrays[trajectory.tokens_field][0].ndim < 1:
            raise InvalidArgument("must be an array of tokens", field=f"fields.{trajectory.tokens_field}")
        num_tokens = arrays[trajectory.tokens_field][0].shape[0]
        if num_tokens < 1:
            raise InvalidArgument("holds no tokens", field=f"fields.{trajectory.tokens_field}")
        response_fields = response_field_names(trajectory, arrays, num_tokens)
        sequence_fields = {
            name for name, (array, _) in arrays.items()
            if array.ndim >= 1 and array.shape[0] == num_tokens and name not in trajectory.non_sequence_fields
        } | response_fields
        alignments = self._alignments(trajectory, sequence_fields)
        num_loss_tokens = self._count_loss_tokens(trajectory, arrays, num_tokens, alignments)

        writes: list[UnitWrite] = []
        units: list[UnitRef] = []
        for name, (array, dtype) in arrays.items():
            sequence = name in sequence_fields
            if array.nbytes == 0:
                raise InvalidArgument("is empty; drop it or make it a scalar", field=f"fields.{name}")
            write = UnitWrite.of_array(trajectory_unit_key(self._namespace, trajectory_id, name), array, dtype,
                                       sequence=sequence)
            kind = UnitKind.TOKEN_FIELD if sequence else UnitKind.FIELD
            coverage = Coverage.RESPONSE if name in response_fields else Coverage.SEQUENCE
            units.append(UnitRef(key=write.key, field_name=name, kind=kind, header=write.header,
                                 alignment=alignments.get(name), coverage=coverage))
            writes.append(write)

        multimodal: list[MultimodalRef] = []
        for i, item in enumerate(trajectory.multimodal):
            if not isinstance(item, MultimodalInput):
                raise InvalidArgument("must be a MultimodalInput", field=f"multimodal[{i}]")
            array, dtype = to_numpy(item.data, field=f"multimodal[{i}].data")
            if array.nbytes == 0:
                raise InvalidArgument("is empty", field=f"multimodal[{i}].data")
            # Content-addressed: the store skips it when a sibling trajectory of the sample stored it first.
            write = UnitWrite.content_addressed_of_array(
                lambda digest: multimodal_unit_key(self._namespace, sample_id, digest), array, dtype
            )
            multimodal.append(
                MultimodalRef(
                    key=write.key, encoder=item.encoder, cost=float(item.cost), placeholder=item.placeholder,
                    kind=item.kind, header=write.header,
                )
            )
            writes.append(write)

        for i, segment in enumerate(trajectory.segments):
            if not isinstance(segment, VersionSegment):
                raise InvalidArgument("must be a VersionSegment", field=f"segments[{i}]")
        meta = TrajectoryMeta(
            trajectory_id=trajectory_id,
            sample_id=sample_id,
            source=SourceName(trajectory.source),
            rollout_step=trajectory.rollout_step,
            num_tokens=num_tokens,
            num_loss_tokens=num_loss_tokens,
            segments=tuple(trajectory.segments),
            units=tuple(units),
            multimodal=tuple(multimodal),
            accepted=bool(trajectory.accepted),
            scalars=tuple(scalars.items()),
            finished_at=self._clock() if trajectory.finished_at is None else float(trajectory.finished_at),
            values=checked_values(trajectory),
            response_start=trajectory.response_start,
        )
        return _Split(meta=meta, writes=tuple(writes))

    @staticmethod
    def _alignments(trajectory: Trajectory, sequence_fields: Collection[str]) -> dict[str, FieldAlignment]:
        """The declared alignments, checked; the loss mask is token-aligned unless declared otherwise."""
        declared = trajectory.field_alignment
        if not isinstance(declared, Mapping):
            raise InvalidArgument("must map field names to 'token' or 'label'", field="field_alignment")
        alignments: dict[str, FieldAlignment] = {}
        for name, value in declared.items():
            where = f"field_alignment.{name}"
            if name not in trajectory.fields:
                raise InvalidArgument("is not one of the fields", field=where)
            if name == trajectory.tokens_field:
                raise InvalidArgument("is the tokens field, an input: labels are made from it", field=where)
            if name not in sequence_fields:
                raise InvalidArgument("is not a per-token field; only those have an alignment", field=where)
            alignments[name] = FieldAlignment.parse(value if isinstance(value, str) else repr(value), where)
        mask = trajectory.loss_mask_field
        if mask is not None and mask in sequence_fields:
            alignments.setdefault(mask, FieldAlignment.TOKEN)
        return alignments

    @staticmethod
    def _count_loss_tokens(
        trajectory: Trajectory, arrays: Mapping[str, tuple[np.ndarray, Any]], num_tokens: int,
        alignments: Mapping[str, FieldAlignment],
    ) -> int:
        """The positions the loss uses: a label exists (every token but the last) and the mask, label-aligned,
        is non-zero there."""
        name = trajectory.loss_mask_field
        if name is None:
            return num_tokens - 1
        if name not in arrays:
            raise InvalidArgument("is missing from the fields (pass loss_mask_field=None if there is none)",
                                  field=f"fields.{name}")
        mask = arrays[name][0]
        if name in trajectory.response_fields and mask.ndim == 1:  # 0 over the prompt, as the packer fills it
            mask = np.concatenate([np.zeros(num_tokens - mask.shape[0], mask.dtype), mask])
        if mask.ndim != 1 or mask.shape[0] != num_tokens or name not in alignments:
            raise InvalidArgument(f"must be a per-token field of shape ({num_tokens},), got {mask.shape}",
                                  field=f"fields.{name}")
        if alignments[name] is FieldAlignment.TOKEN:
            return int(np.count_nonzero(mask[1:]))  # token 0 is never a target
        return int(np.count_nonzero(mask[:-1]))  # the last position predicts nothing
