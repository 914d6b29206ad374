"""Every encoding's ``EncodingRoutes`` in wire form, encoded from the plan's route columns with numpy.

A large mini-batch has tens of thousands of route rows; converting them to protobuf field values one Python int
at a time cost more than the rest of the encoder messages together. The columns are packed varints on the wire,
so each column is varint-encoded once for the whole mini-batch, and an encoding's routes are byte slices of it,
framed as packed fields, which protobuf parses in C (``EncodingRoutes.MergeFromString``). The result is the
message :func:`knittrans.plan.proto.routes_to_proto` builds from the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from knittrans.errors import InvalidArgument
from knittrans.plan.proto import ROUTE_FIELDS
from knittrans.v1 import plan_pb2

WIRE_LENGTH_DELIMITED = 2
_FIELD_NUMBERS = {name: plan_pb2.EncodingRoutes.DESCRIPTOR.fields_by_name[name].number for name in ROUTE_FIELDS}
_IDS_FIELD = "trajectory_ids"
# One-byte tags, which RouteWire writes as such.
assert all(number < 16 for number in _FIELD_NUMBERS.values())
_MAX_VALUE = {
    name: (1 << 32) - 1 if field.type == field.TYPE_UINT32 else (1 << 64) - 1
    for name, field in plan_pb2.EncodingRoutes.DESCRIPTOR.fields_by_name.items() if name != _IDS_FIELD
}


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def framed(field_number: int, data: bytes) -> bytes:
    """``data`` (a serialised message, or packed values) as length-delimited field ``field_number``."""
    return varint(field_number << 3 | WIRE_LENGTH_DELIMITED) + varint(len(data)) + data


def varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Every value (non-negative integers) as a varint, back to back, and where each one's bytes start (one more
    offset at the end)."""
    v = np.asarray(values).astype(np.uint64)
    lengths = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        more = v >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        lengths += more
    offsets = np.zeros(len(v) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    starts = offsets[:-1]
    for k in range(int(lengths.max()) if len(v) else 0):
        has = np.flatnonzero(lengths > k)
        group = (v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        continues = (lengths[has] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + k] = (group | continues).astype(np.uint8)
    return out.tobytes(), offsets


def _spread(destinations: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For runs of ``lengths`` consecutive source bytes, where each byte goes: run i's k-th byte to
    ``destinations[i] + k``."""
    firsts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    return np.repeat(destinations - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


class RouteWire:
    """The route rows of a mini-batch (sorted by encoding; encoding e's are rows ``bounds[e]:bounds[e + 1]``) as
    one buffer holding every encoding's serialised ``EncodingRoutes`` back to back, fields in number order (as
    protobuf serialises them): per encoding, each integer column as one packed field, then each row's trajectory
    id as its own field (a repeated string is not packed). ``columns`` holds every integer column by name."""

    def __init__(self, columns: Mapping[str, np.ndarray], trajectory_ids: Sequence[str], bounds: Sequence[int]):
        bounds = np.asarray(bounds, dtype=np.int64)
        num_encodings = len(bounds) - 1
        # Per field: its tag, its bytes for all rows back to back, and where each row's bytes start.
        fields = []
        for name in ROUTE_FIELDS:
            if name == _IDS_FIELD:
                fields.append((None, *self._framed_ids(trajectory_ids)))
                continue
            values = np.asarray(columns[name])
            if len(values) and (int(values.min()) < 0 or int(values.max()) > _MAX_VALUE[name]):
                raise InvalidArgument("has a value outside its field's range", field=f"routes.{name}")
            data, offsets = varints(values)
            fields.append((_FIELD_NUMBERS[name] << 3 | WIRE_LENGTH_DELIMITED, data, offsets))
        # Each (encoding, field)'s length: a packed field's header (tag, payload length) and payload, or the ids.
        payloads = np.stack([offsets[bounds[1:]] - offsets[bounds[:-1]] for _, _, offsets in fields], axis=1)
        packed = np.array([tag is not None for tag, _, _ in fields]) & (payloads > 0)
        length_bytes, length_offsets = varints(payloads[packed])
        headers = np.zeros_like(payloads)
        headers[packed] = 1 + np.diff(length_offsets)  # every tag here is one byte
        starts = np.zeros(payloads.size + 1, dtype=np.int64)
        np.cumsum((headers + payloads).reshape(-1), out=starts[1:])
        out = np.empty(int(starts[-1]), dtype=np.uint8)
        field_starts = starts[:-1].reshape(payloads.shape)
        # Headers: the tag, then the payload length's varint.
        header_starts = field_starts[packed]
        out[header_starts] = np.array([tag or 0 for tag, _, _ in fields], dtype=np.uint8)[np.nonzero(packed)[1]]
        out[_spread(header_starts + 1, np.diff(length_offsets))] = np.frombuffer(length_bytes, dtype=np.uint8)
        # Payloads: each field's bytes, encoding by encoding.
        for c, (_, data, _offsets) in enumerate(fields):
            out[_spread(field_starts[:, c] + headers[:, c], payloads[:, c])] = np.frombuffer(data, dtype=np.uint8)
        self._data = out.tobytes()
        self._starts = starts[:: len(fields)].tolist() if num_encodings else [0]

    @staticmethod
    def _framed_ids(trajectory_ids: Sequence[str]) -> tuple[bytes, np.ndarray]:
        """Each row's trajectory id as a framed string field, back to back, and where each row's starts."""
        tag = varint(_FIELD_NUMBERS[_IDS_FIELD] << 3 | WIRE_LENGTH_DELIMITED)
        framed: dict[str, bytes] = {}
        for trajectory_id in dict.fromkeys(trajectory_ids):
            encoded = trajectory_id.encode()
            framed[trajectory_id] = tag + varint(len(encoded)) + encoded
        rows = [framed[trajectory_id] for trajectory_id in trajectory_ids]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(row) for row in rows], out=offsets[1:])
        return b"".join(rows), offsets

    def encoding_bytes(self, e: int) -> bytes:
        """Encoding e's ``EncodingRoutes``, serialised as protobuf would (empty when it has no routes)."""
        return self._data[self._starts[e]:self._starts[e + 1]]
