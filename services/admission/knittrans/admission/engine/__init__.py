"""The constraint-preserving admission engine (DESIGN.md §3): pure, deterministic, no I/O, no clock.

Public API
==========

Configuration
    :class:`EngineConfig` (frozen, validated; load it with ``knittrans.config.load_config(EngineConfig,
    path=...)``): ``train_batch_size`` τ₀ and ``num_minibatches`` n; ``sources`` (name → minimum share,
    in priority order); the α schedules ``source_schedule``, ``size_schedule`` and ``completion_schedule``;
    ``completion_quota`` ρ; ``staleness_bound``; ``admission_unit`` (``trajectory`` | ``group``) with
    ``group_size``; ``on_starvation`` (:class:`OnStarvation`: ``wait``, ``relax_after=<d>``,
    ``fail_after=<d>``); ``policy`` (:class:`AdmissionPolicy`: ``train-batch``, ``linear``, ``stream``,
    ``no-guard``, ``knittrans``); ``max_batches_ahead``. Counts (τ₀, mini-batch sizes, quotas) are in
    admission units: trajectories, or groups (the accepted trajectories of one sample).

State and inputs
    ``state = AdmissionState(config, version=v0)``; train batch k trains at policy version v0 + k.

    - ``state.add(PoolEntry(...))`` reports one finished trajectory (``PoolEntry.from_meta`` builds one
      from a :class:`~knittrans.types.TrajectoryMeta`). ``oldest_version`` is the version of its oldest
      token. A filtered one (``accepted=False``) is dropped by the next decision. With ``group`` units, a
      sample enters the pool once all its trajectories are reported (``group_size``, or
      ``state.expect_group(sample_id, size)``).
    - ``state.add_many(PoolEntries(...))`` reports many at once, as columns (the same state as ``add`` for
      each, all or nothing); a service ingesting thousands of reports a second uses it.
    - ``state.add_scheduled(rollout_step, count)`` declares scheduled trajectories for completion quotas
      (a step never counts fewer scheduled trajectories than it has completed ones).

Deciding
    ``decide(state, now, version) -> Admit | Wait | Drop`` is pure: ``now`` is the caller's clock in
    seconds and ``version`` the trainer's current policy version. ``state.apply(decision)`` carries it
    out; apply every decision, waits included (a :class:`Wait` records when its blocking reason began).
    Call ``decide`` after every input or version change and keep applying until it returns a
    :class:`Wait`; call it again at ``Wait.wake_at`` if that is set. ``decisions_until_wait(state, now,
    version)`` is that loop, written once: it yields each decision, the caller applies it (or journals, then
    applies it) before asking for the next.

    - :class:`Admit` lists the trajectory ids of one mini-batch in policy order, with
      ``train_batch_index``, 0-based ``minibatch_index``, ``train_version`` and ``relaxed``.
    - :class:`Wait` carries a :class:`BlockingReason`, a human-readable detail and ``since``.
    - :class:`Drop` lists trajectory ids with a :class:`DropReason` (``stale`` or ``filtered``).

Determinism and journaling
    The state is a function of the sequence of calls on it (``add``, ``add_many``, ``add_scheduled``, ``expect_group``,
    ``apply``). A service journals those inputs and every decision it applied, in order, and rebuilds the
    state after a crash by calling them again; ``decide`` need not be re-run, and re-running it with the
    same ``now`` and ``version`` gives the same decisions anyway. A :class:`Wait` whose reason is unchanged
    is a no-op for ``apply``, so only waits that change the reason need journaling. Ties are broken by
    config order and ids, never by hashing, so the output does not depend on ``PYTHONHASHSEED``.

Simulation
    A simulator drives the same calls on its own clock: ``add_scheduled`` when it schedules trajectories,
    ``add`` with the oldest version of each finished one (its other version segments are its own
    business), ``decide``/``apply`` after each event, and the policy version when a train batch's
    training ends. Set ``max_batches_ahead=0`` for colocated execution (a train batch is admitted only
    after the previous one trained).

Reading
    ``state.status()`` (:class:`EngineStatus`: quotas, per-source counts and slack, blocking reason and
    since), ``state.train_batch_index``, ``state.minibatches_admitted``, ``state.train_version``,
    ``state.pool_size``, ``state.targets`` (:class:`AdmissionTargets`: quotas τ_i, mini-batch sizes, resolved
    schedules).

Performance
    The pool is indexed per source in policy order (oldest version, ready time, id). A decision that
    waits costs O(sources); one that admits m units costs O(m log sources); nothing is ever re-sorted.
"""

from knittrans.admission.engine.config import (
    DEFAULT_STARVATION_SECONDS,
    AdmissionPolicy,
    EngineConfig,
    OnStarvation,
    StarvationAction,
)
from knittrans.admission.engine.decide import decide, decisions_until_wait
from knittrans.admission.engine.decisions import Admit, BlockingReason, Decision, Drop, DropReason, Wait
from knittrans.admission.engine.entries import PoolEntries, PoolEntry
from knittrans.admission.engine.quotas import AdmissionTargets, source_quotas
from knittrans.admission.engine.state import AdmissionState, EngineStatus, SourceStatus

__all__ = [
    "DEFAULT_STARVATION_SECONDS",
    "AdmissionPolicy",
    "AdmissionState",
    "AdmissionTargets",
    "Admit",
    "BlockingReason",
    "Decision",
    "Drop",
    "DropReason",
    "EngineConfig",
    "EngineStatus",
    "OnStarvation",
    "PoolEntries",
    "PoolEntry",
    "SourceStatus",
    "StarvationAction",
    "Wait",
    "decide",
    "decisions_until_wait",
    "source_quotas",
]
