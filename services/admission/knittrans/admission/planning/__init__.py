"""Topology-aware planning of an admitted mini-batch (DESIGN.md §4): a pure core, plus the ``plan`` CLI."""

from knittrans.admission.planning.encoder import ReferenceColumns
from knittrans.admission.planning.planner import PlanLayout, plan_columns, plan_minibatch

__all__ = ["PlanLayout", "ReferenceColumns", "plan_columns", "plan_minibatch"]
