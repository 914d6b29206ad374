"""``knittrans simulate``: a discrete-event simulation of colocated vs disaggregated RL, per admission policy.

It measures what the paper's Figures 2, 7 and 10(b) measure: how much staleness pipelining adds
(architectural staleness: disaggregated minus colocated token-mean staleness per train step, averaged after
warm-up), and how much mini-batch admission takes back. It drives the admission engine the service uses
(``knittrans.admission.engine``), not a copy of it.

``SimConfig`` is the config (load it with ``knittrans.config.load_config``); ``RolloutScript`` with
``LognormalDurations`` or ``TraceDurations`` fixes the rollout shared by every run; ``simulate_policy`` runs
both modes of one policy and returns a ``PolicySimulation`` (``architectural_staleness``, and a
``ModeResult`` per mode); ``report.simulation_json`` and ``plot.plot_simulation`` present the results.
"""

from knittrans.admission.simulate.config import SimConfig, SourceRollout
from knittrans.admission.simulate.modes import MODES, Mode
from knittrans.admission.simulate.results import ModeResult, PolicySimulation, StepResult
from knittrans.admission.simulate.rollout import LognormalDurations, RolloutScript, TraceDurations
from knittrans.admission.simulate.simulator import simulate_mode, simulate_policy

__all__ = [
    "MODES",
    "LognormalDurations",
    "Mode",
    "ModeResult",
    "PolicySimulation",
    "RolloutScript",
    "SimConfig",
    "SourceRollout",
    "StepResult",
    "TraceDurations",
    "simulate_mode",
    "simulate_policy",
]
