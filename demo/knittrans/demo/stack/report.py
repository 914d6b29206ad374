"""The demo's results: a row per optimizer step, the end-to-end checks, a table, JSON and a plot."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from knittrans.demo.trainer_rank import received_hashes


@dataclass(frozen=True, kw_only=True)
class StepRow:
    step: int
    train_batch: int
    minibatch: int
    admitted_at: float  # seconds since the stack started
    trained_at: float
    composition: dict[str, int]
    mean_staleness: float
    # The slowest rank's wait for the mini-batch to be admitted (rollouts slower than training), and its wait for
    # data after admission (planning, reads, packing, delivery): the part KnitTrans' data path exposes.
    admission_wait_seconds: float
    data_wait_after_admission_seconds: float
    compute_seconds: float
    bytes_needed: int
    dedup_factor: float
    loss: float


@dataclass(frozen=True, kw_only=True)
class Checks:
    trained_exactly_once: bool
    quotas_held: bool
    bytes_match: bool
    images_match: bool
    loss_decreased: bool
    details: dict = field(default_factory=dict)
    # With the reference role: every trajectory the actor trained got, byte for byte, the ref_logprobs the
    # reference attached to it, and the reference (the initial policy) scored each trajectory exactly once.
    # None: the run had no reference.
    reference_fields_match: bool | None = None

    @property
    def passed(self) -> bool:
        return self.trained_exactly_once and self.quotas_held and self.bytes_match and self.images_match \
            and self.loss_decreased and self.reference_fields_match is not False


@dataclass(frozen=True, kw_only=True)
class DemoReport:
    steps: tuple[StepRow, ...]
    checks: Checks
    bytes_read: int
    bytes_needed: int
    metrics_urls: tuple[str, ...]
    job: str
    settings: dict
    out: str = ""  # the directory the run wrote to

    def to_json(self) -> str:
        data = {
            "job": self.job,
            "out": self.out,
            "settings": self.settings,
            "steps": [asdict(row) for row in self.steps],
            "checks": {**asdict(self.checks), "passed": self.checks.passed},
            "bytes_read": self.bytes_read,
            "bytes_needed": self.bytes_needed,
            "amplification": round(self.bytes_read / self.bytes_needed, 4) if self.bytes_needed else None,
            "metrics_urls": list(self.metrics_urls),
        }
        return json.dumps(data, indent=2)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_manifests(out: Path) -> dict[str, dict]:
    """trajectory id -> what the rollout wrote (source, version, unit hashes)."""
    trajectories: dict[str, dict] = {}
    for path in sorted(out.glob("manifest-*.json")):
        trajectories.update(json.loads(path.read_text())["trajectories"])
    return trajectories


def build_rows(
    records: list[dict], admissions: dict[int, dict], manifest: dict[str, dict], started_at: float
) -> list[StepRow]:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        by_step[record["step"]].append(record)
    rows = []
    for step in sorted(by_step):
        ranks = by_step[step]
        first = min(ranks, key=lambda r: r["rank"])
        admission = admissions.get(first["sequence"], {})
        ids = admission.get("trajectory_ids", [])
        sources = Counter(manifest[t]["source"] for t in ids if t in manifest)
        versions = [manifest[t]["version"] for t in ids if t in manifest]
        train_version = admission.get("train_version", first["train_version"])
        admitted_at = admission.get("admitted_at", started_at)
        rank_waits = [
            split_wait(waiting_since=r["waiting_since"], received_at=r["received_at"], admitted_at=admitted_at,
                       later_wait_seconds=r["later_wait_seconds"])
            for r in ranks
        ]
        rows.append(
            StepRow(
                step=step,
                train_batch=first["train_batch"],
                minibatch=first["minibatch"],
                admitted_at=round(admitted_at - started_at, 3),
                trained_at=round(max(r["finished_at"] for r in ranks) - started_at, 3),
                composition=dict(sorted(sources.items())),
                mean_staleness=round(sum(train_version - v for v in versions) / len(versions), 3) if versions else 0.0,
                admission_wait_seconds=round(max(waits[0] for waits in rank_waits), 4),
                data_wait_after_admission_seconds=round(max(waits[1] for waits in rank_waits), 4),
                compute_seconds=round(max(r["compute_seconds"] for r in ranks), 4),
                bytes_needed=sum(r.get("bytes_needed", 0) for r in ranks),
                dedup_factor=round(first["dedup_factor"], 3),
                loss=round(first["loss"], 5),
            )
        )
    return rows


def split_wait(
    *, waiting_since: float, received_at: float, admitted_at: float, later_wait_seconds: float
) -> tuple[float, float]:
    """(waiting for admission, waiting for data after admission) of one rank's step, in seconds.

    The rank waited from ``waiting_since`` until its first micro-batch arrived at ``received_at``; the part before
    the mini-batch was admitted is a wait for admission, the rest and every later micro-batch's wait are waits for
    data. All three instants are wall-clock times of the same machine.
    """
    first_wait = max(0.0, received_at - waiting_since)
    for_admission = min(first_wait, max(0.0, admitted_at - waiting_since))
    return for_admission, first_wait - for_admission + later_wait_seconds


def check_run(
    records: list[dict],
    pieces: list[dict],
    admissions: dict[int, dict],
    manifest: dict[str, dict],
    *,
    quotas: dict[str, int],
    num_minibatches: int,
) -> Checks:
    details: dict = {}
    trained = Counter(t for r in records if r["cp_rank"] == 0 for t in r["trajectories"])
    admitted = [t for s in sorted(admissions) for t in admissions[s]["trajectory_ids"]]
    trained_sequences = {r["sequence"] for r in records}
    admitted_trained = [
        t for s in sorted(admissions) if s in trained_sequences for t in admissions[s]["trajectory_ids"]
    ]
    duplicates = [t for t, n in trained.items() if n != 1]
    once = not duplicates and set(trained) == set(admitted_trained) and len(admitted) == len(set(admitted))
    details["trained"] = len(trained)
    details["admitted"] = len(admitted)
    if duplicates:
        details["trained_more_than_once"] = duplicates[:10]

    batches: dict[int, Counter] = defaultdict(Counter)
    sizes: Counter = Counter()
    for admission in admissions.values():
        batch = admission["train_batch_index"]
        sizes[batch] += 1
        for t in admission["trajectory_ids"]:
            if t in manifest:
                batches[batch][manifest[t]["source"]] += 1
    complete = [b for b, n in sizes.items() if n == num_minibatches]
    short = {b: dict(batches[b]) for b in complete if any(batches[b][s] < q for s, q in quotas.items())}
    details["complete_train_batches"] = len(complete)
    if short:
        details["below_quota"] = short

    by_unit: dict[str, list[dict]] = defaultdict(list)
    for piece in pieces:
        by_unit[piece["key"]].append(piece)
    received = received_hashes(by_unit)
    expected = {key: unit["hash"] for t in trained for key, unit in manifest.get(t, {}).get("units", {}).items()
                if key in by_unit}
    missing_fields = [t for t in trained if not any(k in by_unit for k in manifest.get(t, {}).get("units", {}))]
    mismatched = [key for key, digest in expected.items() if received.get(key) != digest]
    details["units_checked"] = len(expected)
    if mismatched or missing_fields:
        details["mismatched_units"] = mismatched[:10]
        details["trajectories_without_fields"] = missing_fields[:10]

    images_seen = {k: v for r in records for k, v in r.get("images_encoded", {}).items()}
    image_expected = {key: m["hash"] for t in trained for key, m in manifest.get(t, {}).get("multimodal", {}).items()}
    bad_images = [k for k, digest in image_expected.items() if images_seen.get(k) != digest]
    details["images_checked"] = len(image_expected)
    if bad_images:
        details["mismatched_images"] = bad_images[:10]

    losses = defaultdict(list)
    for r in records:
        if r["rank"] == 0:
            losses[r["train_batch"]].append(r["loss"])
    means = [sum(v) / len(v) for _, v in sorted(losses.items())]
    finite = all(math.isfinite(loss) for v in losses.values() for loss in v)
    details["loss_by_train_batch"] = [round(m, 4) for m in means]
    return Checks(
        trained_exactly_once=once,
        quotas_held=not short and bool(complete),
        bytes_match=bool(expected) and not mismatched and not missing_fields,
        images_match=bool(image_expected) and not bad_images,
        loss_decreased=finite and len(means) >= 2 and means[-1] < means[0],
        details=details,
    )


def check_reference(
    records: list[dict],
    pieces: list[dict],
    admissions: dict[int, dict],
    attached: list[dict],
    *,
    initial_policy: str,
    field_name: str = "ref_logprobs",
) -> tuple[bool, dict]:
    """``reference_fields_match`` and its details: the actor ranks' received pieces of ``field_name`` (the
    zigzag CP chunks of each trajectory's label-aligned values) reassemble, per trajectory, to the bytes a
    reference rank recorded attaching to it; each trajectory of the trained mini-batches was attached exactly
    once; and every reference rank held the actor's initial policy."""
    details: dict = {}
    trained = {t for r in records if r["cp_rank"] == 0 for t in r["trajectories"]}
    trained_sequences = {r["sequence"] for r in records}
    planned = {t for s in admissions if s in trained_sequences for t in admissions[s]["trajectory_ids"]}
    digests = {a["initial_policy"] for a in attached if "initial_policy" in a}
    scored = [a for a in attached if "trajectory" in a]
    times = Counter(a["trajectory"] for a in scored)
    attached_hash = {a["trajectory"]: a["hash"] for a in scored}
    # Each trajectory of the trained mini-batches scored once; none scored that the actor's steps did not plan.
    not_once = sorted(t for t in planned | set(times) if times[t] != 1 or t not in planned)

    by_unit: dict[str, list[dict]] = defaultdict(list)
    units_of: dict[str, set[str]] = defaultdict(set)
    for piece in pieces:
        if piece["field"] == field_name:
            by_unit[piece["key"]].append(piece)
            units_of[piece["trajectory"]].add(piece["key"])
    received = received_hashes(by_unit)
    mismatched = sorted(t for t in trained if len(units_of[t]) != 1
                        or received[next(iter(units_of[t]))] != attached_hash.get(t))
    details["reference_trajectories_checked"] = len(trained)
    details["reference_attached"] = len(scored)
    if not_once:
        details["reference_not_exactly_once"] = not_once[:10]
    if mismatched:
        details["reference_mismatched"] = mismatched[:10]
    if digests != {initial_policy}:
        details["reference_policies"] = sorted(digests)
    passed = bool(trained) and not not_once and not mismatched and digests == {initial_policy}
    return passed, details


def format_table(rows: list[StepRow]) -> str:
    header = ("step", "tb.mb", "admitted s", "trained s", "composition", "stale", "admission wait s",
              "data wait s", "compute s", "needed KiB", "dedup", "loss")
    lines = [header]
    for row in rows:
        lines.append((
            str(row.step), f"{row.train_batch}.{row.minibatch}", f"{row.admitted_at:.2f}", f"{row.trained_at:.2f}",
            " ".join(f"{k[:4]}={v}" for k, v in row.composition.items()), f"{row.mean_staleness:.2f}",
            f"{row.admission_wait_seconds:.3f}", f"{row.data_wait_after_admission_seconds:.3f}",
            f"{row.compute_seconds:.3f}", f"{row.bytes_needed / 1024:.0f}",
            f"{row.dedup_factor:.1f}", f"{row.loss:.4f}",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in lines)


def plot(rows: list[StepRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    steps = [r.step for r in rows]
    axes[0].plot(steps, [r.loss for r in rows], marker="o")
    axes[0].set(title="loss per optimizer step", xlabel="step", ylabel="loss")
    axes[1].plot(steps, [r.admitted_at for r in rows], marker="o", label="admitted")
    axes[1].plot(steps, [r.trained_at for r in rows], marker="x", label="trained")
    axes[1].set(title="mini-batch timeline", xlabel="step", ylabel="seconds since start")
    axes[1].legend()
    axes[2].bar(steps, [r.admission_wait_seconds for r in rows], width=0.6, color="tab:gray")
    axes[2].set(title="waiting for admission (rollout slower than training)", xlabel="step", ylabel="seconds")
    axes[3].bar([s - 0.2 for s in steps], [r.data_wait_after_admission_seconds for r in rows], width=0.4,
                label="waiting for data after admission")
    axes[3].bar([s + 0.2 for s in steps], [r.compute_seconds for r in rows], width=0.4, label="compute")
    axes[3].set(title="exposed data wait after admission vs compute", xlabel="step", ylabel="seconds")
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
