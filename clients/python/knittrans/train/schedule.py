"""Who encodes which multimodal input, who consumes it, and where its rows go (pure, no torch).

An :class:`EncodingSchedule` is the training-side view of the planner's encoder plan and route map for one
mini-batch. Every rank holds the same global schedule:

- each rank's *encoder* micro-batches: the unique encodings it computes (it is their owner);
- each rank's *backbone* micro-batches: which rows of which encodings fill which placeholder tokens;
- one :class:`EncodingRoute` per encoding: its owner and every rank that consumes it, TP replicas and the
  CP ranks on both sides of a chunk boundary included.

Routes are kept in one canonical order (by key) whatever order they were given in, and every message between
an owner and a consumer, encodings one way and their gradients the other, is laid out by one function
(:meth:`EncodingSchedule.wire`) that both ends call, so a sender and a receiver can never read each other's
rows in different orders. :func:`schedule_from_ranks` is the one way to derive the routes from the ranks.

Construction validates everything that can be known before any tensor exists, so a schedule that would
leave a reference without an encoding, or an encoding without a way back to its owner, never starts a
backward pass.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from knittrans.errors import InvalidArgument
from knittrans.types import UnitKey, check_id


def _check_non_negative(value: int, field_name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"must be a non-negative integer, got {value!r}", field=field_name)


def _check_positive(value: int, field_name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"must be a positive integer, got {value!r}", field=field_name)


@dataclass(frozen=True, kw_only=True)
class EncodingUse:
    """A run of placeholder tokens in one backbone micro-batch filled by consecutive rows of one encoding.

    Tokens ``position .. position + num_rows - 1`` of the micro-batch's local token layout (after packing and
    CP splitting) take rows ``first_row .. first_row + num_rows - 1`` of encoding ``key``. An image whose
    placeholder span is cut by a CP chunk boundary becomes one use on each side, with different rows.
    """

    key: UnitKey
    position: int
    num_rows: int
    first_row: int = 0

    def __post_init__(self) -> None:
        check_id(self.key, "key")
        _check_non_negative(self.position, "position")
        _check_positive(self.num_rows, "num_rows")
        _check_non_negative(self.first_row, "first_row")

    @property
    def end_position(self) -> int:
        return self.position + self.num_rows

    @property
    def end_row(self) -> int:
        return self.first_row + self.num_rows


@dataclass(frozen=True, kw_only=True)
class BackboneMicroBatch:
    """The encoding rows one backbone micro-batch consumes; a key may appear any number of times."""

    uses: tuple[EncodingUse, ...] = ()

    def __post_init__(self) -> None:
        uses = tuple(self.uses)
        object.__setattr__(self, "uses", uses)
        by_position = sorted(range(len(uses)), key=lambda i: uses[i].position)
        for earlier, later in itertools.pairwise(by_position):
            if uses[later].position < uses[earlier].end_position:
                raise InvalidArgument(
                    f"placeholder tokens [{uses[later].position}, {uses[later].end_position}) overlap "
                    f"uses[{earlier}] [{uses[earlier].position}, {uses[earlier].end_position})",
                    field=f"uses[{later}].position",
                )

    @property
    def num_rows(self) -> int:
        return sum(use.num_rows for use in self.uses)


@dataclass(frozen=True, kw_only=True)
class EncoderMicroBatch:
    """Unique encodings computed together in one encoder forward, in output order."""

    keys: tuple[UnitKey, ...]

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        object.__setattr__(self, "keys", keys)
        if not keys:
            raise InvalidArgument("an encoder micro-batch needs at least one key", field="keys")
        seen: set[str] = set()
        for i, key in enumerate(keys):
            check_id(key, f"keys[{i}]")
            if key in seen:
                raise InvalidArgument(f"key {key!r} appears twice", field=f"keys[{i}]")
            seen.add(key)


@dataclass(frozen=True, kw_only=True)
class RankSchedule:
    """What one rank does in the mini-batch.

    ``(dp_rank, cp_rank, tp_rank)`` is the rank's backbone coordinate. Ranks that share ``dp_rank`` and
    ``cp_rank`` form a TP group: they run the same backbone micro-batches and each holds the full gradient
    of the encodings it gathered, so each returns only the rows it owns (row i belongs to TP rank
    i mod tp_size).
    """

    rank: int
    dp_rank: int = 0
    cp_rank: int = 0
    tp_rank: int = 0
    encoder_micro_batches: tuple[EncoderMicroBatch, ...] = ()
    backbone_micro_batches: tuple[BackboneMicroBatch, ...] = ()

    def __post_init__(self) -> None:
        for name in ("rank", "dp_rank", "cp_rank", "tp_rank"):
            _check_non_negative(getattr(self, name), name)
        object.__setattr__(self, "encoder_micro_batches", tuple(self.encoder_micro_batches))
        object.__setattr__(self, "backbone_micro_batches", tuple(self.backbone_micro_batches))

    @property
    def tp_group(self) -> tuple[int, int]:
        return (self.dp_rank, self.cp_rank)

    @property
    def owned_keys(self) -> tuple[UnitKey, ...]:
        """The encodings this rank computes, in encoder micro-batch order."""
        return tuple(key for micro in self.encoder_micro_batches for key in micro.keys)

    def referenced_keys(self) -> set[UnitKey]:
        return {use.key for micro in self.backbone_micro_batches for use in micro.uses}


@dataclass(frozen=True, kw_only=True)
class EncodingRoute:
    """One unique encoding: how many rows it has, the rank that computes it and every rank that consumes it."""

    key: UnitKey
    num_rows: int
    owner: int
    consumers: tuple[int, ...]

    def __post_init__(self) -> None:
        check_id(self.key, "key")
        _check_positive(self.num_rows, "num_rows")
        _check_non_negative(self.owner, "owner")
        consumers = tuple(self.consumers)
        if not consumers:
            raise InvalidArgument("an encoding needs at least one consumer", field="consumers")
        for i, rank in enumerate(consumers):
            _check_non_negative(rank, f"consumers[{i}]")
        if len(set(consumers)) != len(consumers):
            raise InvalidArgument("lists a rank twice", field="consumers")
        object.__setattr__(self, "consumers", tuple(sorted(consumers)))


class WireKind(StrEnum):
    """Which way a message between an owner and a consumer travels."""

    ENCODINGS = "encodings"  # owner -> consumer: every row of each encoding
    GRADIENTS = "gradients"  # consumer -> owner: the rows the consumer's TP rank owns


@dataclass(frozen=True, kw_only=True)
class WireSegment:
    """Rows ``start .. start + num_rows - 1`` of a message belong to encoding ``key``."""

    key: UnitKey
    start: int
    num_rows: int


@dataclass(frozen=True, kw_only=True)
class WireLayout:
    """The layout of the one message between ``owner`` and ``consumer`` in one direction.

    Sender and receiver both take it from :meth:`EncodingSchedule.wire`; the receiver finds an encoding's rows
    with :meth:`segment`, by key, never by assuming the sender packed in some other list's order.
    """

    owner: int
    consumer: int
    kind: WireKind
    segments: tuple[WireSegment, ...]
    _by_key: dict[UnitKey, WireSegment] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {segment.key: segment for segment in self.segments})

    @property
    def num_rows(self) -> int:
        return sum(segment.num_rows for segment in self.segments)

    @property
    def keys(self) -> tuple[UnitKey, ...]:
        return tuple(segment.key for segment in self.segments)

    def segment(self, key: UnitKey) -> WireSegment:
        found = self._by_key.get(key)
        if found is None:
            raise InvalidArgument(
                f"encoding {key!r} is not in the {self.kind.value} message between owner {self.owner} and "
                f"consumer {self.consumer}",
                field="key",
            )
        return found


@dataclass(frozen=True, kw_only=True)
class EncodingSchedule:
    """The global encoding plan of one mini-batch, identical on every rank (see the module docstring)."""

    ranks: tuple[RankSchedule, ...]
    routes: tuple[EncodingRoute, ...]
    tp_size: int = 1
    _route_index: dict[UnitKey, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranks = tuple(self.ranks)
        routes = tuple(self.routes)
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "routes", routes)
        _check_positive(self.tp_size, "tp_size")
        if not ranks:
            raise InvalidArgument("needs at least one rank", field="ranks")
        route_index: dict[UnitKey, int] = {}
        for i, route in enumerate(routes):
            if route.key in route_index:
                raise InvalidArgument(f"key {route.key!r} has two routes", field=f"routes[{i}].key")
            route_index[route.key] = i
        # One canonical order, so that every list derived from the routes is the same whoever built them.
        routes = tuple(sorted(routes, key=lambda route: route.key))
        object.__setattr__(self, "routes", routes)
        route_index = {route.key: i for i, route in enumerate(routes)}
        object.__setattr__(self, "_route_index", route_index)
        self._check_ranks()
        self._check_owners()
        self._check_references()

    def _check_ranks(self) -> None:
        coordinates: dict[tuple[int, int, int], int] = {}
        groups: dict[tuple[int, int], list[RankSchedule]] = {}
        for i, rank in enumerate(self.ranks):
            if rank.rank != i:
                raise InvalidArgument(f"ranks must be listed in order; found rank {rank.rank}", field=f"ranks[{i}]")
            if rank.tp_rank >= self.tp_size:
                raise InvalidArgument(f"{rank.tp_rank} is outside tp_size={self.tp_size}", field=f"ranks[{i}].tp_rank")
            coordinate = (rank.dp_rank, rank.cp_rank, rank.tp_rank)
            if coordinate in coordinates:
                raise InvalidArgument(
                    f"backbone coordinate (dp, cp, tp) = {coordinate} is also rank {coordinates[coordinate]}",
                    field=f"ranks[{i}]",
                )
            coordinates[coordinate] = i
            groups.setdefault(rank.tp_group, []).append(rank)
        for (dp_rank, cp_rank), members in groups.items():
            present = sorted(member.tp_rank for member in members)
            if present != list(range(self.tp_size)):
                # A missing TP rank would silently drop the gradient rows it owns.
                raise InvalidArgument(
                    f"TP group (dp={dp_rank}, cp={cp_rank}) has tp ranks {present}, needs 0..{self.tp_size - 1}",
                    field="ranks",
                )
            first = members[0]
            for member in members[1:]:
                if member.backbone_micro_batches != first.backbone_micro_batches:
                    raise InvalidArgument(
                        f"TP replicas must run the same backbone micro-batches; rank {member.rank} differs "
                        f"from rank {first.rank}",
                        field=f"ranks[{member.rank}].backbone_micro_batches",
                    )

    def _check_owners(self) -> None:
        encoded_by: dict[UnitKey, int] = {}
        for rank in self.ranks:
            for m, micro in enumerate(rank.encoder_micro_batches):
                for k, key in enumerate(micro.keys):
                    path = f"ranks[{rank.rank}].encoder_micro_batches[{m}].keys[{k}]"
                    if key in encoded_by:
                        raise InvalidArgument(
                            f"encoding {key!r} is already encoded by rank {encoded_by[key]}; "
                            "every encoding has exactly one owner",
                            field=path,
                        )
                    encoded_by[key] = rank.rank
                    index = self._route_index.get(key)
                    if index is None:
                        raise InvalidArgument(f"encoding {key!r} has no route to any consumer", field=path)
                    if self.routes[index].owner != rank.rank:
                        raise InvalidArgument(
                            f"encoding {key!r} is encoded by rank {rank.rank} but its route names owner "
                            f"{self.routes[index].owner}",
                            field=path,
                        )
        for i, route in enumerate(self.routes):
            if route.key not in encoded_by:
                raise InvalidArgument(
                    f"encoding {route.key!r} is in no encoder micro-batch of its owner rank {route.owner}",
                    field=f"routes[{i}]",
                )
            for consumer in route.consumers:
                if consumer >= len(self.ranks):
                    raise InvalidArgument(f"rank {consumer} does not exist", field=f"routes[{i}].consumers")

    def _check_references(self) -> None:
        referenced = [rank.referenced_keys() for rank in self.ranks]
        for rank in self.ranks:
            for m, micro in enumerate(rank.backbone_micro_batches):
                for u, use in enumerate(micro.uses):
                    path = f"ranks[{rank.rank}].backbone_micro_batches[{m}].uses[{u}]"
                    index = self._route_index.get(use.key)
                    if index is None:
                        raise InvalidArgument(
                            f"references encoding {use.key!r}, which no rank encodes", field=f"{path}.key"
                        )
                    route = self.routes[index]
                    if rank.rank not in route.consumers:
                        raise InvalidArgument(
                            f"references encoding {use.key!r}, but its route does not deliver it to rank "
                            f"{rank.rank} (consumers {list(route.consumers)})",
                            field=f"{path}.key",
                        )
                    if use.end_row > route.num_rows:
                        raise InvalidArgument(
                            f"rows [{use.first_row}, {use.end_row}) lie outside the {route.num_rows} rows of "
                            f"encoding {use.key!r}",
                            field=f"{path}.num_rows",
                        )
        for i, route in enumerate(self.routes):
            for consumer in route.consumers:
                if route.key not in referenced[consumer]:
                    raise InvalidArgument(
                        f"routes encoding {route.key!r} to rank {consumer}, which never uses it",
                        field=f"routes[{i}].consumers",
                    )

    @classmethod
    def single_process(
        cls,
        *,
        encoder_micro_batches: Iterable[Sequence[str]],
        backbone_micro_batches: Iterable[Iterable[EncodingUse]],
        num_rows: Mapping[str, int],
    ) -> EncodingSchedule:
        """One rank that encodes everything it consumes; routes follow from the micro-batches."""
        encoder = tuple(EncoderMicroBatch(keys=tuple(UnitKey(k) for k in keys)) for keys in encoder_micro_batches)
        backbone = tuple(BackboneMicroBatch(uses=tuple(uses)) for uses in backbone_micro_batches)
        rank = RankSchedule(rank=0, encoder_micro_batches=encoder, backbone_micro_batches=backbone)
        return schedule_from_ranks(ranks=(rank,), num_rows=num_rows)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def route(self, key: UnitKey) -> EncodingRoute:
        index = self._route_index.get(key)
        if index is None:
            raise InvalidArgument(f"no route for encoding {key!r}", field="key")
        return self.routes[index]

    def consumed_keys(self, rank: int) -> tuple[UnitKey, ...]:
        """The encodings ``rank`` caches, in canonical route order."""
        return tuple(route.key for route in self.routes if rank in route.consumers)

    def keys_between(self, owner: int, consumer: int) -> tuple[UnitKey, ...]:
        """Encodings ``owner`` sends to ``consumer``, in canonical route order (by key)."""
        return tuple(route.key for route in self.routes if route.owner == owner and consumer in route.consumers)

    def wire(self, *, owner: int, consumer: int, kind: WireKind) -> WireLayout:
        """The layout of the message between ``owner`` and ``consumer``; both ends of the exchange call this."""
        segments, start = [], 0
        for key in self.keys_between(owner, consumer):
            rows = self.route(key).num_rows if kind is WireKind.ENCODINGS else self.owned_row_count(consumer, key)
            segments.append(WireSegment(key=key, start=start, num_rows=rows))
            start += rows
        return WireLayout(owner=owner, consumer=consumer, kind=kind, segments=tuple(segments))

    def owned_row_count(self, consumer: int, key: UnitKey) -> int:
        """How many gradient rows of ``key`` ``consumer`` returns: those with row % tp_size == its tp rank."""
        tp_rank = self.ranks[consumer].tp_rank
        return len(range(tp_rank, self.route(key).num_rows, self.tp_size))

    @property
    def num_uses(self) -> int:
        """Row runs consumed, counting one replica per TP group."""
        return sum(len(micro.uses) for rank in self.ranks if rank.tp_rank == 0 for micro in rank.backbone_micro_batches)

    def fingerprint(self) -> str:
        """A digest of the whole schedule; ranks compare it before exchanging anything."""
        return hashlib.blake2b(repr(self).encode(), digest_size=16).hexdigest()


def schedule_from_ranks(
    *, ranks: Sequence[RankSchedule], num_rows: Mapping[str, int], tp_size: int = 1
) -> EncodingSchedule:
    """The schedule of ``ranks`` with routes derived from them: an encoding's owner is the rank whose encoder
    micro-batches hold it, its consumers the ranks whose backbone micro-batches use it.

    Every builder (the planner adapter, the single-process case, the demo's gathered parts) goes through here,
    so there is one way to make routes.
    """
    owners: dict[UnitKey, int] = {}
    for rank in ranks:
        for m, micro in enumerate(rank.encoder_micro_batches):
            for k, key in enumerate(micro.keys):
                path = f"ranks[{rank.rank}].encoder_micro_batches[{m}].keys[{k}]"
                if key in owners:
                    raise InvalidArgument(
                        f"encoding {key!r} is computed by ranks {owners[key]} and {rank.rank}", field=path
                    )
                if key not in num_rows:
                    raise InvalidArgument(f"no row count for encoding {key!r}", field="num_rows")
                owners[key] = rank.rank
    consumers: dict[UnitKey, set[int]] = {}
    for rank in ranks:
        for key in rank.referenced_keys():
            consumers.setdefault(key, set()).add(rank.rank)
    missing = sorted(set(consumers) - set(owners))
    if missing:
        raise InvalidArgument(f"encodings {missing} are used but no rank computes them", field="encoder_micro_batches")
    routes = tuple(
        EncodingRoute(key=key, num_rows=num_rows[key], owner=owner, consumers=tuple(sorted(consumers.get(key, ()))))
        for key, owner in owners.items()
    )
    return EncodingSchedule(ranks=tuple(ranks), routes=routes, tp_size=tp_size)
