"""Trace-driven admission replay (``knittrans replay``, the paper's §7.3): the same engine, policy by policy.

``read_trace`` parses a JSON Lines trace (errors name the line and the field), ``replay_policy`` runs one
policy over it on the replay's own timeline, ``replay_json`` and ``comparison_table`` report the results
and ``plot.plot_replay`` draws them.
"""

from knittrans.admission.replay.config import ReplayConfig
from knittrans.admission.replay.driver import PolicyResult, TrainBatchResult, replay_policy
from knittrans.admission.replay.report import comparison_table, replay_json
from knittrans.admission.replay.trace import Trace, TraceRecord, parse_lines, read_trace

__all__ = [
    "PolicyResult",
    "ReplayConfig",
    "Trace",
    "TraceRecord",
    "TrainBatchResult",
    "comparison_table",
    "parse_lines",
    "read_trace",
    "replay_json",
    "replay_policy",
]
