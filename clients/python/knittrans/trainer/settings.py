"""How a :class:`~knittrans.trainer.client.TrainerClient` is configured, and what it counts."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from knittrans.client.connection import ConnectionSettings
from knittrans.errors import InvalidArgument


class DeliveryMode(StrEnum):
    ITER = "iter"  # yield micro-batches as they are ready (prefetching the next ones)
    EAGER = "eager"  # materialise the whole mini-batch first (ablation of consumption-driven delivery)


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    sidecar: str  # "unix:/path/to.sock" (or a bare path)
    tp_rank: int = 0
    global_rank: int = 0
    mode: DeliveryMode = DeliveryMode.ITER
    prefetch: int = 2  # micro-batches staged ahead of the one in use
    device: str = "auto"  # "auto" (CUDA when available), "cpu", "cuda:N"
    poll_seconds: float = 5.0  # one long poll of NextMicroBatch
    sidecar_timeout_seconds: float = 15.0  # an unreachable sidecar raises Unavailable after this long
    wait_timeout_seconds: float = 0.0  # > 0: raise DeadlineExceeded when no micro-batch comes for this long
    # > 0: log a warning when the loop has waited this long for the next micro-batch of a mini-batch it has begun.
    # Between mini-batches a long wait is rollout's; within one, the mini-batch is admitted and being read, and a
    # wait this long is a stall to look into (docs/failures.md, "A step that never ends").
    stall_warning_seconds: float = 60.0
    # The slots the training loop let go of are freed on a tick of this period, not the moment it lets go: a
    # thread woken right then would take the GIL (and, on a busy host, the core) from the loop while it takes the
    # next micro-batch, the one moment its data access is exposed. A slot of a micro-batch the loop had to wait
    # for is freed at once, and so is every slot held back when the loop starts waiting. 0: always at once.
    release_interval_seconds: float = 0.01
    admission: ConnectionSettings | None = None  # progress reports go here; None: nobody is told
    report_progress: bool = True
    advance_version: bool | None = None  # None: global rank 0 does (of the backbone; a trainer role's never)
    store: str = ""  # the unit store's URL: a trainer role's ranks write the fields they attach there
    namespace: str = "default"  # prefix of the keys of attached units (like RolloutClient's)

    def __post_init__(self) -> None:
        if not self.sidecar:
            raise InvalidArgument("must name the sidecar's socket, unix:/path", field="sidecar")
        if not isinstance(self.mode, DeliveryMode):
            object.__setattr__(self, "mode", DeliveryMode(self.mode))
        for name in ("tp_rank", "global_rank"):
            if getattr(self, name) < 0:
                raise InvalidArgument("must not be negative", field=name)
        if self.prefetch < 1:
            raise InvalidArgument("must be at least 1", field="prefetch")
        for name in ("poll_seconds", "sidecar_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidArgument("must be positive", field=name)
        for name in ("wait_timeout_seconds", "stall_warning_seconds", "release_interval_seconds"):
            if getattr(self, name) < 0:
                raise InvalidArgument("must not be negative", field=name)

    @property
    def target(self) -> str:
        return self.sidecar if self.sidecar.startswith("unix:") else f"unix:{self.sidecar}"

    @property
    def advances_version(self) -> bool:
        return self.global_rank == 0 if self.advance_version is None else self.advance_version


@dataclass
class TrainerStats:
    micro_batches: int = 0
    mini_batches: int = 0
    waited_seconds: float = 0.0  # exposed wait of the training loop, summed
    skipped_after_restart: int = 0  # re-published micro-batches skipped after a sidecar restart
    restarts_seen: int = 0
    minibatch_restarts: int = 0  # delivery rounds: a TP rank of the consumer restarted mid-mini-batch
