"""The wire layer: translation between protobuf messages and the typed domain objects of :mod:`knittrans.types`.

- :mod:`.enums`: the closed choices (dtype, unit kind, field alignment) and their proto numbers, defined once;
- :mod:`.trajectory`: trajectory metadata codecs (validating, and trusted for already-checked reports);
- :mod:`.columns`: the columnar form of many trajectories (``TrajectoryBatch``) and its one appender;
- :mod:`.topology`: topologies and consumer ids.
"""

from knittrans.errors import within
from knittrans.wire.topology import consumer_from_proto, consumer_to_proto, topology_from_proto, topology_to_proto
from knittrans.wire.trajectory import (
    header_from_proto,
    header_to_proto,
    multimodal_from_proto,
    multimodal_to_proto,
    trajectory_from_proto,
    trajectory_to_proto,
    trusted_trajectory_from_proto,
    unit_ref_from_proto,
    unit_ref_to_proto,
)

__all__ = [
    "consumer_from_proto",
    "consumer_to_proto",
    "header_from_proto",
    "header_to_proto",
    "multimodal_from_proto",
    "multimodal_to_proto",
    "topology_from_proto",
    "topology_to_proto",
    "trajectory_from_proto",
    "trajectory_to_proto",
    "trusted_trajectory_from_proto",
    "unit_ref_from_proto",
    "unit_ref_to_proto",
    "within",
]
