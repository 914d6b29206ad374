"""What ``knittrans up`` starts (its ``stack.yaml``, loaded with the config loader; unknown keys are errors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.config import build
from knittrans.errors import InvalidArgument
from knittrans.job import check_job
from knittrans.stack.local import StateKind, StoreKind
from knittrans.types import Topology

# Set by `knittrans up` itself, so a stack.yaml names them at its top level (job, state, store) or not at all.
_SET_BY_UP = {"job": "job", "state": "state", "store": "store",
              "server": "the admission service listens on loopback, on a free port"}


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    """``admission`` is the admission service's own config (``engine``, ``topology``, ``schema``, ...; see
    docs/integration.md), without ``job``, ``state``, ``store`` and ``server``, which ``knittrans up`` sets; it is
    checked here against the service's schema, so its errors name ``admission.<key>``. ``job`` names the stack's
    store, sockets and shared memory (default: ``up-<random>``). ``connection_file`` is where the stack's addresses
    are written (default: ``KNITTRANS_CONNECTION_FILE``, else ``knittrans-connection.json`` in the current
    directory). ``log_dir`` keeps the servers' logs after the stack stops (default: a temporary directory,
    removed with the stack)."""

    admission: Mapping[str, Any]
    job: str = ""
    store: StoreKind = StoreKind.FILE
    state: StateKind = StateKind.MEMORY
    connection_file: str = ""
    log_dir: str = ""

    def __post_init__(self) -> None:
        if self.job:
            check_job(self.job)
        for key, why in _SET_BY_UP.items():
            if key in self.admission:
                where = f"set `{why}` at the top level of the stack config" if key == why else why
                raise InvalidArgument(f"is set by knittrans up: {where}", field=f"admission.{key}")
        topology = self.admission_settings.topology
        world_size = topology.backbone.dp * topology.backbone.cp * topology.backbone.tp
        for index, encoder in enumerate(topology.encoders):
            if encoder.dp * encoder.tp > world_size:
                raise InvalidArgument(f"encoder dp × tp = {encoder.dp * encoder.tp} cannot exceed the trainer "
                                      f"ranks (backbone dp × cp × tp = {world_size})",
                                      field=f"admission.topology.encoders[{index}].dp")

    @property
    def admission_settings(self) -> AdmissionServiceSettings:
        """The admission section, validated as the service will read it."""
        return build(AdmissionServiceSettings, {**self.admission, "job": self.job or "default"},
                     prefix="admission.")

    @property
    def topology(self) -> Topology:
        return self.admission_settings.topology
