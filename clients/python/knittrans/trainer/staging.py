"""Turning a published micro-batch into torch tensors (imports torch; only :mod:`knittrans.trainer.client`
loads this module, lazily).

- CPU: tensors view the shared-memory slot (no copy); the prefetch thread maps the pages in first, so the
  training loop gets ready tensors.
- CUDA: the prefetch thread copies the slot into a pinned staging buffer (then the slot can be released), and
  from there to the GPU on a side stream, recording a CUDA event the training loop's stream waits on.
- Materialised (eager mode on CPU): one copy of the slot into private memory, so the slot is released at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from knittrans.errors import InvalidArgument, Unavailable
from knittrans.packed.tensors import TensorSpec
from knittrans.shm import AttachedSegment
from knittrans.trainer.descriptor import MicroBatchDescriptor
from knittrans.types import DType

logger = logging.getLogger(__name__)

PAGE = 4096

TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.BOOL: torch.bool,
    DType.UINT8: torch.uint8,
    DType.INT8: torch.int8,
    DType.UINT16: torch.uint16,
    DType.INT16: torch.int16,
    DType.INT32: torch.int32,
    DType.UINT32: torch.uint32,
    DType.INT64: torch.int64,
    DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT32: torch.float32,
    DType.FLOAT64: torch.float64,
}


class SegmentCache:
    """Segments attached by name; when a slot moves to a new segment (it grew), its old one is closed."""

    def __init__(self) -> None:
        self._by_name: dict[tuple[str, str], AttachedSegment] = {}
        self._slot_names: dict[tuple[str, int], tuple[str, str]] = {}
        self._mapped: dict[tuple[str, str], int] = {}  # bytes of each segment whose pages are mapped in already

    def attach(self, descriptor: MicroBatchDescriptor) -> AttachedSegment:
        name = descriptor.segment
        key = (descriptor.incarnation, name)
        segment = self._by_name.get(key)
        if segment is None:
            try:
                segment = AttachedSegment(name)
            except FileNotFoundError:
                raise Unavailable(f"shared-memory segment {name} is gone (did the sidecar restart?)",
                                  field="segment") from None
            self._by_name[key] = segment
        slot = (descriptor.incarnation, descriptor.slot)
        previous = self._slot_names.get(slot)
        if previous is not None and previous != key:
            old = self._by_name.pop(previous, None)
            self._mapped.pop(previous, None)
            if old is not None:
                old.close()
        self._slot_names[slot] = key
        mapped = self._mapped.get(key, 0)
        if descriptor.used_bytes > mapped:
            # Touch one byte per page once, so the training loop does not take the page faults.
            np.frombuffer(segment.buf, dtype=np.uint8, count=descriptor.used_bytes)[mapped::PAGE].max()
            self._mapped[key] = descriptor.used_bytes
        if segment.buf.nbytes < descriptor.used_bytes:
            raise InvalidArgument(f"segment {name} has {segment.buf.nbytes} bytes, the descriptor needs "
                                  f"{descriptor.used_bytes}", field="used_bytes")
        return segment

    def close(self) -> None:
        for segment in self._by_name.values():
            segment.close()
        self._by_name.clear()
        self._slot_names.clear()
        self._mapped.clear()


def _view(source: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """``spec``'s tensor inside a flat uint8 tensor (no copy)."""
    dtype = TORCH_DTYPES[spec.dtype]
    if spec.num_elements == 0:
        return torch.empty(spec.shape, dtype=dtype, device=source.device)
    return source[spec.offset : spec.end].view(dtype).view(spec.shape)


def shm_tensors(segment: AttachedSegment, descriptor: MicroBatchDescriptor) -> dict[str, torch.Tensor]:
    """Tensors viewing the slot (zero copy); :class:`SegmentCache` mapped its pages in."""
    used = descriptor.used_bytes
    if used:
        flat = torch.frombuffer(segment.buf, dtype=torch.uint8, count=used)
    else:
        flat = torch.empty(0, dtype=torch.uint8)
    return {spec.name: _view(flat, spec) for spec in descriptor.tensors}


def private_tensors(
    segment: AttachedSegment, descriptor: MicroBatchDescriptor, *, pin: bool
) -> dict[str, torch.Tensor]:
    """One copy of the slot into private (optionally pinned) memory, viewed as the descriptor's tensors."""
    used = descriptor.used_bytes
    flat = torch.empty(used, dtype=torch.uint8, pin_memory=pin)
    if used:
        flat.copy_(torch.frombuffer(segment.buf, dtype=torch.uint8, count=used))
    return {spec.name: _view(flat, spec) for spec in descriptor.tensors}


@dataclass
class _Pinned:
    buffer: torch.Tensor
    event: Any = None


class CudaStager:
    """shm -> pinned staging buffer -> GPU (side stream, CUDA event). Buffers are reused round-robin once the
    copy out of them has completed."""

    def __init__(self, device: torch.device, *, buffers: int) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)
        self._pool = [_Pinned(buffer=torch.empty(0, dtype=torch.uint8, pin_memory=True)) for _ in range(buffers)]
        self._next = 0

    def stage(self, segment: AttachedSegment, descriptor: MicroBatchDescriptor) -> tuple[dict[str, torch.Tensor], Any]:
        used = descriptor.used_bytes
        entry = self._pool[self._next]
        self._next = (self._next + 1) % len(self._pool)
        if entry.event is not None:
            entry.event.synchronize()  # the previous GPU copy out of this buffer is done
        if entry.buffer.numel() < used:
            entry.buffer = torch.empty(max(used, int(entry.buffer.numel() * 1.25)), dtype=torch.uint8,
                                       pin_memory=True)
        pinned = entry.buffer[:used]
        if used:
            pinned.copy_(torch.frombuffer(segment.buf, dtype=torch.uint8, count=used))
        with torch.cuda.stream(self._stream):
            flat = torch.empty(used, dtype=torch.uint8, device=self._device)
            flat.copy_(pinned, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        entry.event = event
        return {spec.name: _view(flat, spec) for spec in descriptor.tensors}, event


def wait_on_current_stream(tensors: dict[str, torch.Tensor], event: Any) -> None:
    """Make the training loop's stream wait for the staged copy, and tell the allocator it uses the tensors."""
    if event is None:
        return
    stream = torch.cuda.current_stream()
    stream.wait_event(event)
    for tensor in tensors.values():
        if tensor.is_cuda and tensor.numel():
            tensor.record_stream(stream)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {name!r} asked for, but CUDA is not available", field="device")
    return device


class Stager:
    """What the prefetch thread does with each descriptor (see the module docstring)."""

    def __init__(self, device: str, *, materialise: bool, prefetch: int) -> None:
        self.device = resolve_device(device)
        self._materialise = materialise
        # Several passes over each mini-batch (TrainerClient.mini_batches(passes=...)): the micro-batches are kept
        # after their slots are released, so the prefetch thread copies them out (off the training loop).
        self.copy_for_passes = False
        self._segments = SegmentCache()
        self._cuda = CudaStager(self.device, buffers=prefetch + 2) if self.device.type == "cuda" else None

    def stage(self, descriptor: MicroBatchDescriptor) -> tuple[dict[str, torch.Tensor], Any, bool]:
        """The micro-batch's tensors, the CUDA event of their copy (or None), and whether they are this process's
        own memory (True) or views of the sidecar's slot, valid only until it is released (False)."""
        segment = self._segments.attach(descriptor)
        if self._cuda is not None:
            tensors, event = self._cuda.stage(segment, descriptor)
            return tensors, event, True  # the GPU copy is private: the pinned buffer is what gets reused
        if self._materialise or self.copy_for_passes:
            return private_tensors(segment, descriptor, pin=False), None, True
        return shm_tensors(segment, descriptor), None, False

    def own(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Private copies of tensors that view a slot (staged before passes were asked for)."""
        return {name: tensor.clone() for name, tensor in tensors.items()}

    def ready(self, tensors: dict[str, torch.Tensor], event: Any) -> None:
        wait_on_current_stream(tensors, event)

    def close(self) -> None:
        self._segments.close()
