"""The multi-role arm of ``benchmarks/transfer.py``: a ``reference`` trainer role and the actor on the same data
(docs/roles.md), on a KnitTrans cluster of its own per store.

The job's topology gives the actor (the backbone) the workload's DP x CP x TP and a ``reference`` role with its own
DP and micro-batch budget, CP 1 and TP 1, producing ``ref_logprobs`` (float32, one per token); the actor consumes
it. Roles cannot be combined with encoders yet, so the arm's trajectories are the workload's without images (the
same lengths and token fields). Everything is real: ``knittrans admission serve`` with the roles and the schema,
one ``knittrans reorg serve`` per (role, DP, CP), ``TrainerClient`` s in one process per reference rank and per
actor DP group.

Per step the reference ranks iterate their micro-batches, run the "model" (:func:`reference_logprobs`, a cheap
deterministic function of the tokens, after a simulated forward of ``REFERENCE_FORWARD_FRACTION`` of a training
step's compute), attach the values (``TrainerClient.attach``: a unit per trajectory written to the store and
reported with ``AttachFields``) and complete; the service then dispatches the actor, whose sidecars read the
reported fields and the attached ``ref_logprobs``. Every actor rank checks ``ref_logprobs == reference_logprobs(
input_ids)`` at every real token it received. With ``passes`` > 1 the actor iterates each mini-batch that many
times (``mini_batches(passes=...)``, PPO's epochs), which must move no more bytes: the arm runs its variants
(one pass, then ``passes``; reversed every other run) one after the other with the same rank processes, fresh
clients per variant, each with its own warm-up and measured steps and its own report.

Per role: bytes moved from storage (the role's sidecars' status counters over the measured steps, per step)
against the bytes that role uniquely needs (the reference: the reported fields of every token, CP 1; the actor:
the reported fields of its CP ranges, label look-ahead included, plus ``ref_logprobs`` of every token), and their
ratio (target 1.00x). On the one clock the actor's exposed transfer starts at the step's last report (or when the
actor's loop asked, if later), so it includes the reference's reads, forward and attach and the gating;
``reference_attached_s`` says how much of it the reference took. After each arm every unit the arm wrote or
attached must be gone from the store (released once every rank of both roles stepped).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from transfer_accounting import bytes_uniquely_needed, one_clock_exposed
from transfer_knittrans import STORE_MEDIA, write_step
from transfer_knittrans_cluster import KNITTRANS, Cluster, Consumer, _spawn, _wait_ready, start_store
from transfer_workload import Workload, WorkloadConfig, build_workload

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ConnectionSettings
from knittrans.store.factory import open_store
from knittrans.trainer import TrainerClient, TrainerSettings
from knittrans.types import UnitKey

logger = logging.getLogger("transfer_roles")

REFERENCE = "reference"
FIELD = "ref_logprobs"
REFERENCE_FORWARD_FRACTION = 1 / 3  # a forward pass of a training step's forward + backward
ROLE_CONSUMER = {REFERENCE: f"role:{REFERENCE}", "actor": "backbone"}


def reference_logprobs(tokens: np.ndarray) -> np.ndarray:
    """The reference "model": a cheap deterministic function of the tokens, one float32 per token."""
    return (-np.log1p(np.asarray(tokens, dtype=np.int64) % 1009)).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class ReferenceTopology:
    dp: int
    max_tokens_per_microbatch: int


def roles_workload(config: WorkloadConfig) -> Workload:
    """The workload's trajectories without images (roles and encoders cannot be combined yet)."""
    return build_workload(dataclasses.replace(config, images_per_prompt=0))


def needed_bytes(workload: Workload) -> dict[str, int]:
    """Per role, the bytes it uniquely needs per step (see the module docstring)."""
    config = workload.config
    reference = Workload(config=dataclasses.replace(config, cp=1, tp=1), lengths=workload.lengths)
    return {REFERENCE: bytes_uniquely_needed(reference).total,
            "actor": bytes_uniquely_needed(workload).total + 4 * sum(workload.lengths)}


def start_roles_cluster(config: WorkloadConfig, reference: ReferenceTopology, *, store: str, directory: Path,
                        slots: int) -> Cluster:
    job = f"roles{uuid.uuid4().hex[:6]}"
    store_url, mooncake = start_store(store, job=job, directory=directory)
    topology = {
        "backbone": {"dp": config.dp, "cp": config.cp, "tp": config.tp,
                     "max_tokens_per_microbatch": config.max_tokens_per_micro_batch},
        "consumes": [FIELD],
        "roles": [{"name": REFERENCE, "produces": [FIELD],
                   "backbone": {"dp": reference.dp, "max_tokens_per_microbatch": reference.max_tokens_per_microbatch}}],
    }
    token_fields: dict[str, Any] = {spec.name: {"dtype": spec.dtype, **(
        {"row_shape": list(spec.per_token_shape)} if spec.per_token_shape else {})} for spec in config.token_fields}
    token_fields[FIELD] = {"dtype": "float32", "attached_by": REFERENCE}
    admission_config = directory / "admission.yaml"
    admission_config.write_text(yaml.safe_dump({
        "job": job, "store": store_url, "topology": topology, "schema": {"token_fields": token_fields},
        "engine": {"train_batch_size": config.num_trajectories, "num_minibatches": 1, "sources": {"bench": 1.0}},
        "server": {"host": "127.0.0.1", "port": 0, "metrics": {"port": -1}},
    }))
    ready = directory / "admission.ready"
    admission = _spawn("admission", [KNITTRANS, "admission", "serve", "--config", str(admission_config),
                                     "--ready-file", str(ready)], directory, ready)
    _wait_ready([admission])
    reorg_config = directory / "reorg.yaml"
    reorg_config.write_text(yaml.safe_dump({"job": job, "store": store_url, "ring": {"slots": slots},
                                            "server": {"metrics": {"port": -1}}}))
    consumers = [Consumer(role="backbone", dp_rank=d, cp_rank=c) for d in range(config.dp) for c in range(config.cp)]
    consumers += [Consumer(role=ROLE_CONSUMER[REFERENCE], dp_rank=d) for d in range(reference.dp)]
    sidecars = {}
    for consumer in consumers:
        ready = directory / f"{consumer.name}.ready"
        sidecars[consumer] = _spawn(
            consumer.name,
            [KNITTRANS, "--log-level", "WARNING", "reorg", "serve", "--config", str(reorg_config), "--role",
             consumer.role, "--dp-rank", str(consumer.dp_rank), "--cp-rank", str(consumer.cp_rank), "--admission",
             admission.ready["address"], "--ready-file", str(ready)],
            directory, ready)
    _wait_ready(list(sidecars.values()))
    return Cluster(directory=directory, job=job, store_url=store_url, admission=admission, sidecars=sidecars,
                   mooncake=mooncake)


# ------------------------------------------------------------------------------------------------ ranks


@dataclass(frozen=True, kw_only=True)
class RankTask:
    """One process: a reference rank (one socket) or an actor DP group (its CP x TP ranks). It runs the arm's
    variants one after the other (``steps`` mini-batches each, with ``passes[v]`` passes of the actor), with
    fresh clients per variant, as a restarted training job would."""

    role: str  # REFERENCE or "actor"
    dp_rank: int
    sockets: tuple[tuple[int, int, str], ...]  # (cp rank, tp rank, socket)
    admission: str
    store_url: str
    namespace: str
    prefetch: int
    steps: int
    passes: tuple[int, ...]
    config: dict[str, Any]


def _real(micro: Any) -> np.ndarray:
    """The packed positions of real (non-padding) tokens of this CP rank's micro-batch."""
    cu = micro["cu_seqlens"].numpy()
    lengths = micro["seq_lengths"].numpy()
    positions = micro["position_ids"].numpy()[: cu[-1]]
    return np.flatnonzero(positions < np.repeat(lengths, np.diff(cu)))


def _attach_reference(client: TrainerClient, micro: Any, record: dict[str, Any]) -> None:
    """The reference "model" over the micro-batch's whole sequences (CP 1), attached."""
    cu, lengths, ids = micro["cu_seqlens"].numpy(), micro["seq_lengths"].numpy(), micro["input_ids"].numpy()
    values = [reference_logprobs(ids[cu[i]:cu[i] + lengths[i]]) for i in range(len(micro.trajectory_ids))]
    started = time.perf_counter()
    client.attach(micro, {FIELD: values})
    record["attach_s"] += time.perf_counter() - started
    record["attached"] += len(values)


def _run_variant(task: RankTask, variant: int, config: WorkloadConfig, results: Any) -> None:
    is_reference = task.role == REFERENCE
    passes = 1 if is_reference else task.passes[variant]
    fraction = REFERENCE_FORWARD_FRACTION if is_reference else 1.0
    clients = [TrainerClient(TrainerSettings(
        sidecar=socket, tp_rank=t, global_rank=(task.dp_rank * config.cp + c) * config.tp + t, device="cpu",
        prefetch=task.prefetch, admission=ConnectionSettings(target=task.admission), sidecar_timeout_seconds=30,
        advance_version=not is_reference and (task.dp_rank, c, t) == (0, 0, 0),
        store=task.store_url if is_reference else "", namespace=task.namespace))
        for c, t, socket in task.sockets]
    try:
        streams = [client.mini_batches(passes=passes) for client in clients]
        for step in range(task.steps):
            record: dict[str, Any] = {"role": task.role, "dp": task.dp_rank, "variant": variant, "step": step,
                                      "asked": time.time(), "ready": [], "compute_end": [], "real_tokens": [0] * passes,
                                      "mismatched_tokens": 0, "attach_s": 0.0, "attached": 0}
            minis = [next(stream) for stream in streams]
            record["assigned_at"] = [m.descriptor.assigned_at for m in minis]
            for number in range(passes):
                iterators = [iter(mini) for mini in minis]
                while (micros := [next(iterator, None) for iterator in iterators])[0] is not None:
                    record["ready"].append(time.time())
                    started = time.perf_counter()
                    tokens = int(micros[0]["seq_lengths"].sum()) if micros[0].trajectory_ids else 0
                    for micro, (_, tp_rank, _) in zip(micros, task.sockets, strict=True):
                        if tp_rank == 0 and micro.trajectory_ids:
                            real = _real(micro)
                            record["real_tokens"][number] += len(real)
                            if not is_reference:  # the oracle: the reference's function of what arrived
                                got = micro[FIELD].numpy()[real].view(np.uint32)
                                want = reference_logprobs(micro["input_ids"].numpy()[real]).view(np.uint32)
                                record["mismatched_tokens"] += int((got != want).sum())
                    time.sleep(max(0.0, fraction * config.seconds_per_token * tokens - (time.perf_counter() - started)))
                    record["compute_end"].append(time.time())
                    if is_reference and micros[0].trajectory_ids:
                        _attach_reference(clients[0], micros[0], record)
            record["attached_at"] = time.time()
            for mini in minis:
                mini.complete()
            results.put(record)
    finally:
        for client in clients:
            client.close()


def rank_main(task: RankTask, ready: Any, results: Any) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.setswitchinterval(2e-4)  # as in transfer_knittrans.group_main
    config = WorkloadConfig.from_dict(task.config)
    try:
        # The clients (fresh per variant) import torch; do it before the barrier, so no step waits for it.
        import torch  # noqa: F401

        ready.wait()
        for variant in range(len(task.passes)):
            _run_variant(task, variant, config, results)
    except BaseException as error:
        results.put({"role": task.role, "dp": task.dp_rank, "error": f"{type(error).__name__}: {error}"})
        ready.abort()


# ------------------------------------------------------------------------------------------------ arm


def _units_left(store: Any, keys: list[UnitKey], *, lease_seconds: float, timeout: float = 60.0) -> int:
    """Units of ``keys`` still stored once their release had time to land (a hang guard: it must come).

    Mooncake leases every unit it is asked about (``batch_is_exist`` too) for ``lease_seconds`` and removes a
    released unit only once no lease holds it: asking more often than once a lease would keep the units alive,
    so with leases it asks once a lease (after the actor's last reads' leases ended)."""
    interval = lease_seconds + 1.0 if lease_seconds else 0.05
    deadline = time.monotonic() + max(timeout, 3 * interval)
    while True:
        if lease_seconds:
            time.sleep(interval)
        left = sum(store.exists(keys))
        if not left or time.monotonic() > deadline:
            return left
        if not lease_seconds:
            time.sleep(interval)


def _step_figures(records: list[dict[str, Any]], workload: Workload, *, reported: float, passes: int,
                  where: str) -> dict[str, Any]:
    """One step's figures from its ranks' records; raises unless each role got every token (each pass) and the
    actor's ref_logprobs are the reference's function of its tokens."""
    refs = [r for r in records if r["role"] == REFERENCE]
    actors = [r for r in records if r["role"] == "actor"]
    expected = sum(workload.lengths)
    checks = {"reference_tokens": sum(r["real_tokens"][0] for r in refs),
              "reference_attached_trajectories": sum(r["attached"] for r in refs),
              "actor_tokens_per_pass": [sum(r["real_tokens"][p] for r in actors) for p in range(passes)],
              "actor_ref_logprobs_mismatched_tokens": sum(r["mismatched_tokens"] for r in actors)}
    if list(checks.values()) != [expected, workload.num_trajectories, [expected] * passes, 0]:
        raise RuntimeError(f"{where}: delivered {checks}, expected {expected} tokens to each role and pass, "
                           f"{workload.num_trajectories} attachments and no mismatch")

    def exposed(r: dict[str, Any]) -> float:
        return one_clock_exposed(start=max(reported, r["asked"]), ready=r["ready"], compute_end=r["compute_end"])

    return {
        "actor_exposed_one_clock_s": max(exposed(r) for r in actors),
        "actor_first_microbatch_from_last_report_s": max(r["ready"][0] - max(reported, r["asked"]) for r in actors),
        "actor_dispatched_s": max(t for r in actors for t in r["assigned_at"]) - reported,
        "actor_asked_s": max(r["asked"] for r in actors) - reported,
        "reference_attached_s": max(r["attached_at"] for r in refs) - reported,
        "reference_exposed_one_clock_s": max(exposed(r) for r in refs),
        "reference_attach_calls_s": max(r["attach_s"] for r in refs),
        "step_s": max(r["compute_end"][-1] for r in actors) - reported, **checks}


def _role_bytes(cluster: Cluster, workload: Workload, before: dict[Consumer, Any], after: dict[Consumer, Any],
                steps: int) -> dict[str, Any]:
    needed = needed_bytes(workload)
    roles: dict[str, Any] = {}
    for role, consumer_role in ROLE_CONSUMER.items():
        mine = [c for c in after if c.role == consumer_role]
        moved = sum(after[c].bytes_read - before[c].bytes_read for c in mine) // steps
        roles[role] = {
            "reads": ("the reported fields (" + ", ".join(s.name for s in workload.config.token_fields) +
                      ") of every token" if role == REFERENCE else "the reported fields of its CP ranges (label "
                      f"look-ahead included) and the attached {FIELD} of every token"),
            "sidecars": len(mine), "bytes_moved_from_storage": moved, "bytes_uniquely_needed": needed[role],
            "amplification": moved / needed[role],
            "bytes_needed_by_plans": sum(after[c].bytes_needed - before[c].bytes_needed for c in mine) // steps,
            "read_calls_per_step": sum(after[c].read_calls - before[c].read_calls for c in mine) / steps}
    return roles


def run_roles_arm(cluster: Cluster, workload: Workload, reference: ReferenceTopology, *, first_step: int,
                  warmup_steps: int, steps: int, prefetch: int, passes: Sequence[int], report_ahead: bool = True
                  ) -> list[dict[str, Any]]:
    """One report per variant (``passes[v]`` passes of the actor), each after its own warm-up steps and with
    ``steps`` measured ones (the first cold; with ``report_ahead`` each later one is reported as soon as the one
    before it: earlier than :func:`transfer_knittrans.run_arm` reports it, so this arm's cold step shares the
    machine with the next mini-batch's dispatch). The rank processes start once for all variants."""
    config = workload.config
    total = warmup_steps + steps
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(config.dp + reference.dp + 1)
    results = context.Queue()
    store = open_store(cluster.store_url, job=cluster.job)
    common = {"admission": cluster.address, "store_url": cluster.store_url, "namespace": cluster.job,
              "prefetch": prefetch, "steps": total, "passes": tuple(passes), "config": config.to_dict()}
    tasks = [RankTask(role=REFERENCE, dp_rank=d, sockets=((0, 0, cluster.socket(
        Consumer(role=ROLE_CONSUMER[REFERENCE], dp_rank=d))),), **common) for d in range(reference.dp)]
    tasks += [RankTask(role="actor", dp_rank=d, sockets=tuple(
        (c, t, cluster.socket(Consumer(role="backbone", dp_rank=d, cp_rank=c)))
        for c in range(config.cp) for t in range(config.tp)), **common) for d in range(config.dp)]
    processes = [context.Process(target=rank_main, args=(task, ready, results), daemon=True,
                                 name=f"{task.role}-{task.dp_rank}") for task in tasks]
    for process in processes:
        process.start()
    reports: list[dict[str, Any]] = []
    waiting: dict[tuple[int, int], list[dict[str, Any]]] = {}
    ended = False  # else the ranks may wait on barriers or queues forever: stop them at once
    try:
        ready.wait(timeout=300)
        with AdmissionClient(cluster.address) as admission:
            for variant, variant_passes in enumerate(passes):
                arm = f"knittrans-roles-passes{variant_passes}"
                base = first_step + variant * total
                ahead = [report_ahead and warmup_steps < step for step in range(total)]
                written = [write_step(workload, store, cluster.job, base + step, base + step - ahead[step])[0]
                           for step in range(total)]
                reported: dict[int, float] = {}
                before: dict[Consumer, Any] = {}
                per_step: list[dict[str, Any]] = []

                def report(step: int, written: list = written, reported: dict = reported) -> None:
                    reported[step] = time.time()
                    admission.report(written[step])

                for step in range(total):
                    if step == warmup_steps:
                        before = cluster.statuses()  # the warm-up's reads are over: its records are in
                    if step not in reported:
                        report(step)
                    if report_ahead and warmup_steps <= step < total - 1:
                        report(step + 1)  # lands while this step trains
                    while len(waiting.get((variant, step), [])) < len(tasks):
                        record = results.get(timeout=600)
                        if "error" in record:
                            raise RuntimeError(f"{arm}: {record['role']} rank {record['dp']} failed: "
                                               f"{record['error']}")
                        waiting.setdefault((record["variant"], record["step"]), []).append(record)
                    figures = _step_figures(waiting.pop((variant, step)), workload, reported=reported[step],
                                            passes=variant_passes, where=f"{arm} step {step}")
                    figures["kind"] = "warm-up" if step < warmup_steps else "cold" if step == warmup_steps \
                        else "steady"
                    logger.info("[%s] step %d (%s): actor first micro-batch %.4f s after the report (the reference "
                                "attached at %.4f s, the actor dispatched at %.4f s), exposed on one clock %.4f s",
                                arm, step, figures["kind"], figures["actor_first_microbatch_from_last_report_s"],
                                figures["reference_attached_s"], figures["actor_dispatched_s"],
                                figures["actor_exposed_one_clock_s"])
                    if step >= warmup_steps:
                        per_step.append(figures)
                roles = _role_bytes(cluster, workload, before, cluster.statuses(), steps)
                keys = [UnitKey(f"{cluster.job}/t/{meta.trajectory_id}/{name}") for metas in written
                        for meta in metas for name in [*(spec.name for spec in config.token_fields), FIELD]]
                units_left = _units_left(store, keys, lease_seconds=0.0 if cluster.mooncake is None
                                         else cluster.mooncake.config.lease_ttl_ms / 1000)
                files_left = None
                if cluster.store_url.startswith("file://"):
                    units = Path(cluster.store_url.removeprefix("file://")) / "units"
                    files_left = sum(1 for _ in units.iterdir()) if units.exists() else 0
                roles[REFERENCE].update({"dp": reference.dp, "cp": 1, "tp": 1,
                                         "max_tokens_per_microbatch": reference.max_tokens_per_microbatch,
                                         "attached_bytes_written_per_step": 4 * sum(workload.lengths)})
                roles["actor"].update({"dp": config.dp, "cp": config.cp, "tp": config.tp, "passes": variant_passes,
                                       "max_tokens_per_microbatch": config.max_tokens_per_micro_batch})
                steady = [s["actor_exposed_one_clock_s"] for s in per_step[1:]]
                reports.append({
                    "arm": arm, "passes": variant_passes, "report_ahead": report_ahead, "roles": roles,
                    "clock": "from the step's last report (or the actor's loop asking, if later) to every actor "
                             "rank holding its first micro-batch, plus every later second outside compute: it "
                             "includes the reference's reads, simulated forward and attach (reference_attached_s) "
                             "and the actor's gating on them (actor_dispatched_s)",
                    "actor_first_microbatch_from_last_report_s_cold":
                        per_step[0]["actor_first_microbatch_from_last_report_s"],
                    "actor_exposed_one_clock_cold_s": per_step[0]["actor_exposed_one_clock_s"],
                    "actor_exposed_one_clock_steady_s_per_step": statistics.median(steady) if steady else None,
                    "reference_attached_s_cold": per_step[0]["reference_attached_s"],
                    "units_left_in_store_after_release": units_left, "unit_files_left": files_left,
                    "steps": per_step})
        ended = True
    finally:
        store.close()
        for process in processes:
            process.join(timeout=30 if ended else 0)
            if process.is_alive():
                process.kill()
    return reports


class RolesClusters:
    """One multi-role cluster per store, kept up for the whole run so that its arms interleave with the others."""

    def __init__(self, config: WorkloadConfig, reference: ReferenceTopology, *, stores: Sequence[str],
                 slots: int = 2, prefetch: int = 1) -> None:
        self._workload = roles_workload(config)
        self._reference = reference
        self._prefetch = prefetch
        self._clusters: dict[str, Cluster] = {}
        self._next_step: dict[str, int] = {}
        self._described: dict[str, dict[str, Any]] = {}
        try:
            for store in stores:
                directory = Path(tempfile.mkdtemp(prefix=f"kt-transfer-roles-{store}-"))
                started = time.perf_counter()
                self._clusters[store] = cluster = start_roles_cluster(config, reference, store=store,
                                                                      directory=directory, slots=slots)
                self._next_step[store] = 0
                self._described[store] = {"store_url": cluster.store_url, "setup_s": time.perf_counter() - started,
                                          "sidecars": len(cluster.sidecars), "logs": str(directory)}
                logger.info("multi-role cluster on the %s store ready (%d sidecars)", store, len(cluster.sidecars))
        except BaseException:
            self.close()
            raise

    def run(self, store: str, passes: Sequence[int], *, warmup_steps: int, steps: int) -> list[dict[str, Any]]:
        """The arm on one store, one report per variant of ``passes``."""
        reports = run_roles_arm(self._clusters[store], self._workload, self._reference,
                                first_step=self._next_step[store], warmup_steps=warmup_steps, steps=steps,
                                prefetch=self._prefetch, passes=passes)
        self._next_step[store] += (warmup_steps + steps) * len(passes)
        for report in reports:
            report.update({"arm": f"{report['arm']}-{store}", "store": store, "medium": STORE_MEDIA[store]})
        return reports

    def close(self, *, keep_logs: bool = False) -> dict[str, Any]:
        for store, cluster in self._clusters.items():
            self._described[store]["shm_segments_left_after_shutdown"] = len(cluster.stop(keep_logs=keep_logs))
            self._described[store]["logs"] = str(cluster.directory) if keep_logs else None
        self._clusters.clear()
        return {"reference": dataclasses.asdict(self._reference), "field": FIELD,
                "reference_forward_fraction": REFERENCE_FORWARD_FRACTION, "images": 0, "stores": self._described}


def summarise_roles(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians per arm over the runs, and the targets: 1.00x per role, no more bytes with more passes, an empty
    store after every arm."""
    per_arm: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["arm"] for r in records):
        rows = [r for r in records if r["arm"] == name]
        per_arm[name] = {key: statistics.median(r[key] for r in rows) for key in (
            "actor_first_microbatch_from_last_report_s_cold", "actor_exposed_one_clock_cold_s",
            "reference_attached_s_cold")}
        steady = [r["actor_exposed_one_clock_steady_s_per_step"] for r in rows
                  if r["actor_exposed_one_clock_steady_s_per_step"] is not None]
        per_arm[name]["actor_exposed_one_clock_steady_s_per_step"] = statistics.median(steady) if steady else None
        for role in ROLE_CONSUMER:
            per_arm[name][f"{role}_bytes_moved_from_storage"] = statistics.median(
                r["roles"][role]["bytes_moved_from_storage"] for r in rows)
            per_arm[name][f"{role}_amplification"] = sorted({round(r["roles"][role]["amplification"], 4)
                                                             for r in rows})
    targets: dict[str, Any] = {}
    for role in ROLE_CONSUMER:
        measured = sorted({round(r["roles"][role]["amplification"], 4) for r in records})
        targets[f"{role}_amplification_from_bytes_moved"] = {
            "measured": measured, "target": "1.0000", "met": all(a == 1.0 for a in measured)}
    for store in dict.fromkeys(r["store"] for r in records):
        moved: dict[int, set[int]] = {}
        for r in records:
            if r["store"] == store:
                moved.setdefault(r["passes"], set()).add(r["roles"]["actor"]["bytes_moved_from_storage"])
        if len(moved) > 1:
            targets[f"actor_bytes_moved_with_more_passes_{store}"] = {
                "measured_per_passes": {p: sorted(v) for p, v in sorted(moved.items())}, "target": "no growth",
                "met": len(set().union(*moved.values())) == 1}
    left = [(r["units_left_in_store_after_release"], r["unit_files_left"]) for r in records]
    # (units, files) per arm; files is None on Mooncake (no unit files), so the pairs are kept in arm order.
    targets["store_empty_after_each_arm"] = {"units_and_files_left": list(dict.fromkeys(left)), "target": "0",
                                             "met": all(u == 0 and not f for u, f in left)}
    return {"per_arm_medians": per_arm, "targets": targets}
