"""The connection file: everything a rollout worker and a trainer rank need to reach a running stack.

``knittrans up`` writes it once every server of the stack is ready and removes it when the stack stops; the
clients' ``from_env`` constructors (:mod:`knittrans.connect`) read it, so user code names no address. It is
JSON, typed and versioned::

    {"kind": "knittrans.connection", "version": 1, "job": "own-trainer", "pid": 4242,
     "admission": "127.0.0.1:40123", "store": "file:///dev/shm/knittrans-own-trainer/units", "world_size": 2,
     "sidecars": [{"role": "backbone", "dp_rank": 0, "cp_rank": 0, "global_ranks": [0],
                   "socket": "unix:/tmp/knittrans-own-trainer/reorg-backbone-dp0-cp0.sock"}, ...]}

Each sidecar lists the global trainer ranks that read it, the i-th being its TP rank i. ``knittrans up`` numbers
ranks as Megatron does (TP fastest, then CP, then DP): the backbone sidecar (d, c) serves global ranks
``(d·cp + c)·tp + t``, and encoder DP rank d is read by global ranks ``d·tp_encoder + t``; a trainer role's
sidecars (docs/roles.md) are numbered the same way within that role's own ranks.

A file of another kind, of a newer version, or with an unknown key is refused with a :class:`ConfigError` naming
the key; the path comes from :func:`knittrans.config.connection_file_path`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from knittrans.config import build
from knittrans.errors import ConfigError, InvalidArgument, NotFound
from knittrans.job import check_job
from knittrans.types import BACKBONE_ROLE, ENCODER_ROLE_PREFIX, ConsumerId

CONNECTION_FILE_KIND = "knittrans.connection"
CONNECTION_FILE_VERSION = 1
_POLL_SECONDS = 0.1


@dataclass(frozen=True, kw_only=True)
class SidecarEndpoint:
    """One consumer's reorg sidecar: its socket and the global trainer ranks (TP ranks in order) that read it."""

    role: str
    dp_rank: int
    cp_rank: int = 0
    socket: str
    global_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        ConsumerId(role=self.role, dp_rank=self.dp_rank, cp_rank=self.cp_rank)  # validates the three
        if not self.socket.startswith("unix:"):
            raise InvalidArgument(f"must be unix:/path, got {self.socket!r}", field="socket")
        if not self.global_ranks or any(rank < 0 for rank in self.global_ranks):
            raise InvalidArgument("must list the non-negative ranks that read this sidecar", field="global_ranks")

    @property
    def consumer(self) -> ConsumerId:
        return ConsumerId(role=self.role, dp_rank=self.dp_rank, cp_rank=self.cp_rank)


@dataclass(frozen=True, kw_only=True)
class StackConnection:
    """The contents of a connection file (see the module docstring)."""

    kind: str = CONNECTION_FILE_KIND
    version: int = CONNECTION_FILE_VERSION
    job: str
    pid: int = 0  # the `knittrans up` process that serves the stack
    admission: str  # host:port of the admission service
    store: str  # the unit store's URL
    world_size: int  # trainer ranks: backbone dp × cp × tp
    sidecars: tuple[SidecarEndpoint, ...]

    def __post_init__(self) -> None:
        if self.kind != CONNECTION_FILE_KIND:
            raise InvalidArgument(f"must be {CONNECTION_FILE_KIND!r}, got {self.kind!r}", field="kind")
        if self.version != CONNECTION_FILE_VERSION:
            raise InvalidArgument(f"this knittrans reads version {CONNECTION_FILE_VERSION}, got {self.version}",
                                  field="version")
        check_job(self.job)
        for name in ("admission", "store"):
            if not getattr(self, name):
                raise InvalidArgument("must not be empty", field=name)
        if self.world_size < 1:
            raise InvalidArgument("must be at least 1", field="world_size")
        seen: set[tuple[str, int]] = set()
        for index, sidecar in enumerate(self.sidecars):
            # The backbone's ranks and its encoders' are the trainer's; a trainer role numbers its own from 0.
            bounded = sidecar.role == BACKBONE_ROLE or sidecar.role.startswith(ENCODER_ROLE_PREFIX)
            for rank in sidecar.global_ranks:
                if (bounded and rank >= self.world_size) or (sidecar.role, rank) in seen:
                    raise InvalidArgument(f"rank {rank} is outside world_size or read twice in role {sidecar.role}",
                                          field=f"sidecars[{index}].global_ranks")
                seen.add((sidecar.role, rank))

    def sidecar_for(self, global_rank: int, role: str = BACKBONE_ROLE) -> tuple[SidecarEndpoint, int]:
        """The sidecar that global rank ``global_rank`` reads for ``role``, and its TP rank in that sidecar."""
        for sidecar in self.sidecars:
            if sidecar.role == role and global_rank in sidecar.global_ranks:
                return sidecar, sidecar.global_ranks.index(global_rank)
        roles = sorted({s.role for s in self.sidecars})
        raise NotFound(f"no {role} sidecar serves global rank {global_rank} in job {self.job!r} "
                       f"(world size {self.world_size}, roles {', '.join(roles)})")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def parse_connection(text: str, *, where: str = "connection file") -> StackConnection:
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}", field=where) from exc
    if not isinstance(data, dict):
        raise ConfigError("the top level must be an object", field=where)
    return build(StackConnection, data)


def read_connection_file(path: Path, *, wait_seconds: float = 0.0) -> StackConnection:
    """The stack connection in ``path``, waiting up to ``wait_seconds`` for it to appear (a stack still
    starting writes it once every server is ready)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            text = path.read_text()
            break
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                waited = f" after {wait_seconds:g}s" if wait_seconds else ""
                raise NotFound(f"no connection file at {path}{waited}: start the stack with `knittrans up`, or "
                               "set KNITTRANS_CONNECTION_FILE to the file it wrote") from None
            time.sleep(_POLL_SECONDS)
    return parse_connection(text, where=str(path))


def write_connection_file(path: Path, connection: StackConnection) -> None:
    """Write atomically (readers never see half a file), readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(connection.to_json())
    temporary.chmod(0o600)
    temporary.replace(path)
