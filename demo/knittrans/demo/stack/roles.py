"""`knittrans demo --roles reference,actor`: what a frozen ``reference`` role adds to the demo's stack.

The admission config gets the role (its own topology, cp 1: a producing role holds whole sequences), the actor
consumes the ``ref_logprobs`` it produces, and the job declares its schema (a job with roles must): the fields,
scalars and per-token row shapes the demo's rollout workers submit (:mod:`knittrans.demo.workload`,
:func:`knittrans.demo.rollout_worker.submit_trajectory`) plus the attached field. The stack starts one
``role:reference`` sidecar and one reference rank process (:mod:`knittrans.demo.reference_rank`) per reference
DP rank.
"""

from __future__ import annotations

from knittrans.demo.stack.settings import DemoRole, DemoSettings
from knittrans.demo.workload import WorkloadSpec
from knittrans.types import ConsumerId

REFERENCE_FIELD = "ref_logprobs"
REFERENCE_CONSUMER_ROLE = f"role:{DemoRole.REFERENCE}"


def demo_schema() -> dict:
    """The trajectory schema of the demo's rollouts, with the reference's attached field."""
    workload = WorkloadSpec()  # the rollout workers' routing width (their spec differs in seeds and sizes only)
    return {
        "token_fields": {
            "input_ids": {"dtype": "int32"},
            "loss_mask": {"dtype": "uint8"},  # label-aligned
            "logprobs": {"dtype": "float32"},  # label-aligned
            "routing": {"dtype": "uint8", "row_shape": [workload.routing_top_k]},
            REFERENCE_FIELD: {"dtype": "float32", "attached_by": DemoRole.REFERENCE.value},  # label-aligned
        },
        "scalars": {"reward": {"kind": "float"}, "advantage": {"kind": "float"}},
    }


def with_reference_role(config: dict, settings: DemoSettings) -> dict:
    """``config`` (the admission service's) with the reference role, the actor's consumption and the schema."""
    topology = {
        **config["topology"],
        "consumes": [REFERENCE_FIELD],
        "roles": [{
            "name": DemoRole.REFERENCE.value,
            "backbone": {"dp": settings.reference_dp, "cp": 1, "tp": 1,
                         "max_tokens_per_microbatch": settings.reference_max_tokens_per_microbatch},
            "produces": [REFERENCE_FIELD],
        }],
    }
    return {**config, "topology": topology, "schema": demo_schema()}


def reference_consumers(settings: DemoSettings) -> list[ConsumerId]:
    """One ``role:reference`` consumer per reference DP rank (cp 1), or none without the reference."""
    if not settings.with_reference:
        return []
    return [ConsumerId(role=REFERENCE_CONSUMER_ROLE, dp_rank=d) for d in range(settings.reference_dp)]
