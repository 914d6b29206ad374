"""Moving encodings and their gradients between ranks.

:class:`LocalTransport` is the single-process case: every encoding is owned and consumed by rank 0, so
nothing moves. :class:`ProcessGroupTransport` uses a ``torch.distributed`` process group: gloo on CPU,
nccl on GPU. Each exchange is one batch of point-to-point sends and receives, one message per peer and
direction, so no tags are needed and NCCL groups the operations (no send/send deadlock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from knittrans.errors import FailedPrecondition


@dataclass(frozen=True, kw_only=True)
class ReceiveSpec:
    """Shape and dtype of the one buffer a peer sends."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class Transport(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """Every rank's ``values`` (same length on every rank), indexed by rank."""
        ...

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, ReceiveSpec], device: torch.device
    ) -> dict[int, torch.Tensor]:
        """Send ``sends[peer]`` to each peer and return what each peer in ``receives`` sent, on ``device``."""
        ...


class LocalTransport:
    """One process: rank 0 of 1."""

    rank = 0
    world_size = 1

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        return [tuple(int(v) for v in values)]

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, ReceiveSpec], device: torch.device
    ) -> dict[int, torch.Tensor]:
        if sends or receives:
            raise FailedPrecondition("a single process has no peers to exchange encodings with")
        return {}


class ProcessGroupTransport:
    """Ranks of one ``torch.distributed`` process group (the default group when ``group`` is None)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise FailedPrecondition("torch.distributed is not initialised; call init_process_group first")
        self._group = group
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)
        # NCCL moves only CUDA tensors; gloo moves CPU tensors.
        if dist.get_backend(group) == "nccl":
            self._comm_device = torch.device("cuda", torch.cuda.current_device())
        else:
            self._comm_device = torch.device("cpu")

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def all_gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        local = torch.tensor(list(values), dtype=torch.int64, device=self._comm_device)
        gathered = [torch.empty_like(local) for _ in range(self._world_size)]
        dist.all_gather(gathered, local, group=self._group)
        return [tuple(int(v) for v in tensor.tolist()) for tensor in gathered]

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, ReceiveSpec], device: torch.device
    ) -> dict[int, torch.Tensor]:
        received = {
            peer: torch.empty(spec.shape, dtype=spec.dtype, device=self._comm_device)
            for peer, spec in sorted(receives.items())
        }
        operations = [
            dist.P2POp(dist.irecv, buffer, group=self._group, group_peer=peer) for peer, buffer in received.items()
        ]
        outgoing = {peer: tensor.contiguous().to(self._comm_device) for peer, tensor in sorted(sends.items())}
        operations += [
            dist.P2POp(dist.isend, tensor, group=self._group, group_peer=peer) for peer, tensor in outgoing.items()
        ]
        if operations:
            for work in dist.batch_isend_irecv(operations):
                work.wait()
        return {peer: buffer.to(device) for peer, buffer in received.items()}


def default_transport(group: dist.ProcessGroup | None = None) -> Transport:
    """The process group when torch.distributed is initialised (or a group is given), else one process."""
    if group is not None or (dist.is_available() and dist.is_initialized()):
        return ProcessGroupTransport(group)
    return LocalTransport()
