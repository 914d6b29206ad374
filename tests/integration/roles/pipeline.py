"""A PPO-shaped pipeline through the real stack (docs/roles.md): ``knittrans admission serve`` with three trainer
roles (``reference`` produces ``ref_logprobs``, ``critic`` produces ``values`` and trains, the backbone (the
actor) consumes both), one ``knittrans reorg serve`` sidecar per (role, dp rank), real :class:`TrainerClient` s
and a real file store. The producers' values are computed from the tokens by functions the pipeline does not know
(the oracle keeps what each producer attached, and compares the actor's tensors with those bytes)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from knittrans.client.connection import ConnectionSettings
from knittrans.rollout import RolloutClient
from knittrans.trainer import MiniBatch, TrainerClient, TrainerSettings
from knittrans.types import VersionSegment
from tests.integration.reorg.processes import Process, start_sidecar

DP = {"reference": 1, "critic": 3, "backbone": 2}  # a different dp per role
TOPOLOGY = {
    "backbone": {"dp": DP["backbone"], "max_tokens_per_microbatch": 96},
    "consumes": ["ref_logprobs", "values"],
    "roles": [
        {"name": "reference", "backbone": {"dp": DP["reference"], "max_tokens_per_microbatch": 160},
         "produces": ["ref_logprobs"]},
        {"name": "critic", "backbone": {"dp": DP["critic"], "max_tokens_per_microbatch": 64},
         "produces": ["values"]},
    ],
}
SCHEMA = {"token_fields": {
    "input_ids": {"dtype": "int32"},
    "ref_logprobs": {"dtype": "float32", "attached_by": "reference"},
    "values": {"dtype": "float32", "row_shape": [2], "coverage": "response", "attached_by": "critic"},
}}
ROLE_OF = {"reference": "role:reference", "critic": "role:critic", "backbone": "backbone"}


def reference_logprobs(tokens: np.ndarray) -> np.ndarray:
    return (-np.log1p(tokens % 97)).astype(np.float32)


def critic_values(tokens: np.ndarray, response_start: int) -> np.ndarray:
    response = tokens[response_start:].astype(np.float64)
    return np.stack([np.sin(response), np.cos(response) / 3], axis=1).astype(np.float32)


@dataclass
class Written:
    tokens: np.ndarray
    response_start: int


@dataclass
class Pipeline:
    job: str
    store_url: str
    directory: Path
    rollout: RolloutClient
    written: dict[str, Written] = field(default_factory=dict)
    sidecars: dict[tuple[str, int], Process] = field(default_factory=dict)
    trainers: dict[tuple[str, int], TrainerClient] = field(default_factory=dict)
    streams: dict[tuple[str, int], Iterator[MiniBatch]] = field(default_factory=dict)
    attached: dict[str, dict[str, np.ndarray]] = field(default_factory=lambda: {"ref_logprobs": {}, "values": {}})
    trained: dict[str, list[str]] = field(default_factory=lambda: {"reference": [], "critic": [], "backbone": []})
    counter: Iterator[int] = field(default_factory=itertools.count)

    def write(self, count: int) -> list:
        metas = []
        for _ in range(count):
            index = next(self.counter)
            rng = np.random.default_rng(1000 + index)
            length = int(rng.integers(4, 60))
            start = int(rng.integers(1, length))
            tokens = rng.integers(1, 50_000, length, dtype=np.int32)
            metas.append(self.rollout.submit({"input_ids": tokens}, trajectory_id=f"t{index}", sample_id=f"s{index}",
                                             source="A", rollout_step=0, response_start=start, loss_mask_field=None,
                                             segments=(VersionSegment(version=0, num_tokens=length),)))
            self.written[f"t{index}"] = Written(tokens=tokens, response_start=start)
        return metas

    def start_role(self, role: str, admission: str) -> None:
        for dp in range(DP[role]):
            sidecar = start_sidecar(self.directory, job=self.job, store=self.store_url, admission=admission,
                                    dp_rank=dp, cp_rank=0, role=ROLE_OF[role])
            self.sidecars[(role, dp)] = sidecar
            # Hang guards only: a dead sidecar or a lost mini-batch raises instead of waiting forever.
            trainer = TrainerClient(TrainerSettings(
                sidecar=sidecar.ready["address"], admission=ConnectionSettings(target=admission),
                store=self.store_url, namespace=self.job, poll_seconds=2.0, sidecar_timeout_seconds=20.0,
                wait_timeout_seconds=90.0))
            self.trainers[(role, dp)] = trainer
            self.streams[(role, dp)] = trainer.mini_batches()

    def next_minibatch(self, role: str, dp: int) -> MiniBatch:
        return next(self.streams[(role, dp)])

    def run_reference(self, *, step: bool = True) -> int:
        """Each reference rank computes ref_logprobs for its trajectories and attaches them, micro-batch by
        micro-batch; returns the mini-batch's sequence."""
        sequence = 0
        for dp in range(DP["reference"]):
            mini = self.next_minibatch("reference", dp)
            sequence = mini.sequence
            for micro in mini:
                values = [reference_logprobs(self.written[t].tokens) for t in micro.trajectory_ids]
                if micro.trajectory_ids:
                    self.trainers[("reference", dp)].attach(micro, {"ref_logprobs": values})
                for t, v in zip(micro.trajectory_ids, values, strict=True):
                    self.attached["ref_logprobs"][t] = v
                self.trained["reference"].extend(micro.trajectory_ids)
            if step:
                mini.complete()
        return sequence

    def receive_critic(self) -> list[MiniBatch]:
        """The critic ranks' mini-batches, received (their micro-batches iterated) but nothing attached yet."""
        received = []
        for dp in range(DP["critic"]):
            mini = self.next_minibatch("critic", dp)
            ids: list[str] = []
            for micro in mini:
                ids.extend(micro.trajectory_ids)
            received.append((mini, ids))
        return received

    def attach_critic(self, received: list, *, step: bool = True) -> None:
        """Each critic rank attaches its values for the whole mini-batch at once, then trains (steps)."""
        for dp, (mini, ids) in enumerate(received):
            values = {t: critic_values(self.written[t].tokens, self.written[t].response_start) for t in ids}
            if values:
                self.trainers[("critic", dp)].attach(mini, {"values": values}, coverage={"values": "response"})
            self.attached["values"].update(values)
            self.trained["critic"].extend(ids)
            if step:
                mini.complete()

    def run_actor(self, *, step: bool = True) -> list[MiniBatch]:
        """Each actor rank checks what it receives against the producers' bytes."""
        minis = []
        for dp in range(DP["backbone"]):
            mini = self.next_minibatch("backbone", dp)
            for micro in mini:
                tensors = {name: tensor.numpy().copy() for name, tensor in micro.tensors.items()}
                cu = tensors["cu_seqlens"]
                sequence_rows = micro.sequence_rows()
                for i, t in enumerate(micro.trajectory_ids):
                    w = self.written[t]
                    rows = slice(int(cu[i]), int(cu[i]) + len(w.tokens))
                    assert sequence_rows[i] == rows, t
                    np.testing.assert_array_equal(tensors["input_ids"][rows], w.tokens)
                    ref = tensors["ref_logprobs"][rows]
                    assert ref.tobytes() == self.attached["ref_logprobs"][t].tobytes(), t
                    values = tensors["values"][rows]
                    mask = tensors["values.mask"][rows]
                    response = np.arange(len(w.tokens)) >= w.response_start
                    np.testing.assert_array_equal(mask, response.astype(mask.dtype))
                    assert values[response].tobytes() == self.attached["values"][t].tobytes(), t
                    assert not values[~response].any()
                self.trained["backbone"].extend(micro.trajectory_ids)
            if step:
                mini.complete()
            minis.append(mini)
        return minis

    def close(self) -> None:
        for trainer in self.trainers.values():
            trainer.close()
        for sidecar in self.sidecars.values():
            sidecar.stop()
