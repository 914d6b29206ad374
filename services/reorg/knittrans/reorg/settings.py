"""The reorg sidecar's config (one YAML file, ``KNITTRANS_*`` variables and flags via :mod:`knittrans.config`).

Example::

    job: grpo-7b
    role: backbone          # or encoder:<name>, or role:<name> (a trainer role)
    dp_rank: 0
    cp_rank: 1
    # consumers: [backbone:0:0, backbone:0:1, encoder:vision:0:0]   # one process for a node's consumers
    store: mooncake://10.0.0.5:50051
    admission:
      target: admission.knittrans:50051
      token_file: /var/run/secrets/knittrans/token
    ring:
      slots: 4
    packing:
      pack_multiple: 128
    server:
      unix_socket: /run/knittrans/reorg-backbone-dp0-cp1.sock
      metrics: {port: 9402}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from knittrans.client.connection import ClientTlsSettings, ConnectionSettings
from knittrans.errors import InvalidArgument
from knittrans.job import check_job, job_run_directory
from knittrans.reorg.packing import PackSettings
from knittrans.serving.settings import ServerSettings
from knittrans.shm import segment_prefix
from knittrans.types import ConsumerId

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
MAX_NICE = 19


@dataclass(frozen=True, kw_only=True)
class AdmissionLink:
    """How the sidecar reaches the admission service."""

    target: str = ""
    token: str = ""
    token_file: str = ""
    tls: ClientTlsSettings = field(default_factory=ClientTlsSettings)
    deadline_seconds: float = 10.0
    give_up_after_seconds: float = 0.0  # 0: keep reconnecting while the service restarts

    def __post_init__(self) -> None:
        if self.deadline_seconds <= 0:
            raise InvalidArgument("must be positive", field="deadline_seconds")
        if self.give_up_after_seconds < 0:
            raise InvalidArgument("must not be negative", field="give_up_after_seconds")

    def connection(self) -> ConnectionSettings:
        if not self.target:
            raise InvalidArgument("the sidecar needs the admission service's address", field="admission.target")
        return ConnectionSettings(target=self.target, token=self.token, token_file=self.token_file, tls=self.tls)


@dataclass(frozen=True, kw_only=True)
class RingSettings:
    slots: int = 4
    initial_slot_bytes: int = 0  # segments are sized by the first micro-batch and grow when one does not fit

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise InvalidArgument("must be at least 1", field="slots")
        if self.initial_slot_bytes < 0:
            raise InvalidArgument("must not be negative", field="initial_slot_bytes")


@dataclass(frozen=True, kw_only=True)
class ReorgSettings:
    job: str = ""  # empty: the admission service's job (learned when the sidecar registers)
    role: str = "backbone"
    dp_rank: int = 0
    cp_rank: int = 0
    store: str = ""  # unit store URL (file://, mooncake://, ray://)
    admission: AdmissionLink = field(default_factory=AdmissionLink)
    ring: RingSettings = field(default_factory=RingSettings)
    packing: PackSettings = field(default_factory=PackSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    read_retry_seconds: float = 30.0
    retained_minibatches: int = 16  # mini-batch contexts kept for GetMiniBatch
    # The consumers this process hosts, as role:dp_rank:cp_rank, over one assignment stream
    # (knittrans.reorg.node_feed); empty: the one consumer named by role, dp_rank and cp_rank.
    consumers: tuple[str, ...] = ()
    # The process's CPU niceness (0-19; one that starts nicer keeps its own). A sidecar's work is background to
    # the trainer's: it packs ahead while the rank computes, and where the two share cores the scheduler should
    # give the training loop the CPU the moment it takes its next micro-batch (benchmarks/transfer.py, steady
    # state). A rank waiting for data leaves the CPU to the sidecar anyway. 0 where other busy work on the node
    # starves the sidecar (knittrans_reorg_trainer_wait_seconds grows).
    cpu_nice: int = 10

    def __post_init__(self) -> None:
        if self.job:
            check_job(self.job)
        if not 0 <= self.cpu_nice <= MAX_NICE:
            raise InvalidArgument(f"must be in [0, {MAX_NICE}], got {self.cpu_nice}", field="cpu_nice")
        self.consumer  # noqa: B018 (validates role and ranks)
        hosted = self.hosted_consumers
        if len(set(hosted)) != len(hosted):
            raise InvalidArgument("names a consumer twice", field="consumers")
        if len(hosted) > 1 and self.server.unix_socket:
            raise InvalidArgument("one socket cannot serve several consumers: leave it to the default per consumer",
                                  field="server.unix_socket")
        if not self.store:
            raise InvalidArgument("must name the unit store, e.g. file:///dev/shm/knittrans-job", field="store")
        if self.read_retry_seconds < 0:
            raise InvalidArgument("must not be negative", field="read_retry_seconds")
        if self.retained_minibatches < 1:
            raise InvalidArgument("must be at least 1", field="retained_minibatches")
        if len(self.socket_path) > MAX_SOCKET_PATH:
            raise InvalidArgument(f"longer than {MAX_SOCKET_PATH} characters", field="server.unix_socket")

    @property
    def consumer(self) -> ConsumerId:
        return ConsumerId(role=self.role, dp_rank=self.dp_rank, cp_rank=self.cp_rank)

    @property
    def hosted_consumers(self) -> tuple[ConsumerId, ...]:
        """Every consumer this process hosts, in the order given."""
        if not self.consumers:
            return (self.consumer,)
        return tuple(parse_consumer(text, f"consumers[{i}]") for i, text in enumerate(self.consumers))

    def for_consumer(self, consumer: ConsumerId) -> ReorgSettings:
        """The settings of one hosted consumer's sidecar."""
        return replace(self, role=consumer.role, dp_rank=consumer.dp_rank, cp_rank=consumer.cp_rank, consumers=())

    @property
    def owner_name(self) -> str:
        """Names this sidecar's segments and default socket: one per (role, dp rank, cp rank) of a job."""
        return f"{_UNSAFE.sub('_', self.role)}-dp{self.dp_rank}-cp{self.cp_rank}"

    @property
    def segment_prefix(self) -> str:
        return segment_prefix(self.job, self.owner_name)

    @property
    def socket_path(self) -> str:
        return self.server.unix_socket or default_socket_path(self.job, self.consumer)


def parse_consumer(text: str, field_name: str = "consumer") -> ConsumerId:
    """``role:dp_rank:cp_rank`` (the role may hold colons: ``encoder:vision:3:0``) as a consumer."""
    role, _, ranks = str(text).rpartition(":")
    role, _, dp = role.rpartition(":")
    if not role or not dp.isdigit() or not ranks.isdigit():
        raise InvalidArgument(f"{text!r} is not role:dp_rank:cp_rank (e.g. backbone:0:1)", field=field_name)
    try:
        return ConsumerId(role=role, dp_rank=int(dp), cp_rank=int(ranks))
    except InvalidArgument as error:
        raise InvalidArgument(f"{text!r}: {error.message}", field=field_name) from None


def default_socket_path(job: str, consumer: ConsumerId) -> str:
    """``/tmp/knittrans-<job>/reorg-<role>-dp<d>-cp<c>.sock``: what a trainer on the same node dials."""
    owner = f"{_UNSAFE.sub('_', consumer.role)}-dp{consumer.dp_rank}-cp{consumer.cp_rank}"
    return str(job_run_directory(job) / f"reorg-{owner}.sock")
