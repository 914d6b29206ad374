"""Topology-aware planning of an admitted mini-batch (DESIGN.md §4): a pure core, plus the ``plan`` CLI."""

from knittrans.admission.planning.planner import plan_minibatch

__all__ = ["plan_minibatch"]
