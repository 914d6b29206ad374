"""``KnitTransGRPOTrainer``: TRL's ``GRPOTrainer`` whose generation batches go through KnitTrans and whose optimizer
steps train on the mini-batches KnitTrans admits and plans.

Two seams of TRL's trainer change, nothing else:

- ``_generate_and_score_completions`` (TRL generates, scores and computes the advantages as always) also submits
  the batch: each completion becomes a trajectory in the unit store, reported to the admission service
  (:func:`~knittrans.integrations.trl.trajectories.generation_trajectories`).
- ``training_step`` trains, once per optimizer step, on the next mini-batch from the rank's reorg sidecar: every
  packed micro-batch forward and backward, each micro-batch's summed token loss divided by the mini-batch's
  ``global_loss_tokens`` (:mod:`~knittrans.integrations.trl.loss`). TRL's scheduling, logging, gradient clipping,
  optimizer, scheduler and checkpoints stay TRL's.

A process has an :class:`~knittrans.client.admission.AdmissionClient` and a rollout client, a trainer client, or
both (:class:`KnitTransClients`): both in one process is TRL's own colocated loop; a rollout-only process runs
:meth:`KnitTransGRPOTrainer.generate_and_submit`, and trainer-only processes (one per data-parallel rank) run
``train()``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback
from trl import GRPOTrainer

from knittrans.client.admission import AdmissionClient
from knittrans.errors import FailedPrecondition, InvalidArgument, MiniBatchRestarted
from knittrans.integrations.trl.loss import PolicyLossSettings, micro_batch_loss
from knittrans.integrations.trl.resume import mark_started, next_sequence, write_restored_step
from knittrans.integrations.trl.settings import (
    KnitTransGRPOSettings,
    TrainBatchShape,
    engine_config,
    trajectory_schema,
)
from knittrans.integrations.trl.trajectories import GenerationBatchIds, generation_trajectories
from knittrans.rollout import RolloutClient
from knittrans.steps import StepId
from knittrans.trainer.batches import MicroBatch, MiniBatch
from knittrans.trainer.client import TrainerClient

logger = logging.getLogger(__name__)

# Admission waits for more ready data (AdmissionStatus.blocking_reason): the rollout generates. While it waits for
# the trainers, the rollout waits too.
WAITING_FOR_DATA = frozenset({"train_batch_size", "source_quota", "completion_quota", "feasibility"})


@dataclass(frozen=True, kw_only=True, eq=False)
class KnitTransClients:
    """The KnitTrans clients of one process. ``rollout`` submits generation batches (its reporter is flushed
    after each), ``trainer`` yields this rank's mini-batches; ``admission`` reads the policy version and takes
    checkpoint reports."""

    admission: AdmissionClient
    rollout: RolloutClient | None = None
    trainer: TrainerClient | None = None

    def __post_init__(self) -> None:
        if self.rollout is None and self.trainer is None:
            raise InvalidArgument("a process needs a rollout client, a trainer client or both", field="rollout")


def _unsupported(trainer: Any) -> list[str]:
    """GRPOTrainer features whose loss KnitTrans's packed path does not reproduce."""
    args = trainer.args
    checks = [
        (trainer.beta != 0.0, "beta (a KL term needs reference log-probs)"),
        (trainer.importance_sampling_level != "token", "importance_sampling_level other than 'token'"),
        (trainer.mask_truncated_completions, "mask_truncated_completions"),
        (trainer.top_entropy_quantile < 1.0, "top_entropy_quantile"),
        (trainer._entropy_bonus_enabled, "an entropy bonus (entropy_coef)"),
        (trainer.off_policy_mask_threshold is not None, "off_policy_mask_threshold"),
        (trainer.use_vllm, "use_vllm (submit from the vLLM side with a rollout-only process)"),
        (trainer.aux_loss_enabled, "a MoE auxiliary loss"),
        (bool(trainer.tools) or trainer.environment_factories is not None, "tools and environments"),
        (trainer._is_vlm, "vision-language models"),
        (args.num_iterations != 1, "num_iterations other than 1 (use KnitTrans passes)"),
    ]
    return [what for failed, what in checks if failed]


class _ReportProgress(TrainerCallback):
    """After each optimizer step: report it (and the policy version) to KnitTrans; after each save: the
    checkpoint."""

    def __init__(self, trainer: KnitTransGRPOTrainer) -> None:
        self._trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trainer._complete_minibatch()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._trainer._report_checkpoint(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class KnitTransGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(...)`` plus ``knittrans=KnitTransClients(...)`` and ``knittrans_settings`` (see the module
    docstring and docs/integrations/trl.md)."""

    def __init__(self, *args: Any, knittrans: KnitTransClients,
                 knittrans_settings: KnitTransGRPOSettings | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(knittrans, KnitTransClients):
            raise InvalidArgument("must be KnitTransClients", field="knittrans")
        unsupported = _unsupported(self)
        if unsupported:
            raise InvalidArgument(f"not supported through KnitTrans: {', '.join(unsupported)}", field="args")
        self.knittrans = knittrans
        self.knittrans_settings = knittrans_settings or KnitTransGRPOSettings()
        self._loss_settings = PolicyLossSettings(loss_type=self.loss_type, epsilon_low=self.epsilon_low,
                                                 epsilon_high=self.epsilon_high, delta=self.args.delta)
        self._start = self._agreed_start()
        self._generation = 0
        self._minibatches: Iterator[MiniBatch] | None = None
        self._current: MiniBatch | None = None
        self._last_sequence: int | None = None  # of the last mini-batch taken from the trainer client
        self._extra_batches: Iterator[Any] | None = None
        self.last_step: StepId | None = None  # the last mini-batch whose optimizer step finished here
        self.submitted: list[str] = []  # trajectory ids this process submitted, in order
        self.add_callback(_ReportProgress(self))

    def _agreed_start(self) -> str:
        """A name for this start, process 0's for every process of the world (a GRPO group can span processes,
        and keeps one sample id)."""
        start = [secrets.token_hex(4)]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(start, from_process=0)
        return start[0]

    # ---- what the admission service needs ----------------------------------------------------------------

    @property
    def train_batch_shape(self) -> TrainBatchShape:
        """A KnitTrans train batch is one TRL generation batch over all trainer ranks (this process's world)."""
        args = self.args
        return TrainBatchShape.of(per_device_train_batch_size=args.per_device_train_batch_size,
                                  gradient_accumulation_steps=args.gradient_accumulation_steps,
                                  steps_per_generation=args.steps_per_generation,
                                  num_generations=self.num_generations, world_size=self.accelerator.num_processes)

    @property
    def ships_old_logprobs(self) -> bool:
        """TRL computes the old policy's log-probs when a generation batch spans optimizer steps."""
        return bool(self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations))

    def admission_config(self) -> dict[str, Any]:
        """The admission service's ``engine`` and ``schema`` sections for this trainer's job."""
        return {"engine": engine_config(self.knittrans_settings, self.train_batch_shape),
                "schema": trajectory_schema(old_logprobs=self.ships_old_logprobs)}

    # ---- rollout: generation batches into KnitTrans --------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        if self.model.training and self.knittrans.rollout is not None:
            self._submit(inputs, output)
        return output

    def _submit(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> None:
        rollout = self.knittrans.rollout
        assert rollout is not None
        settings = self.knittrans_settings
        sources = [str(row.get(settings.source_column, settings.default_source)) for row in inputs]
        version = self.knittrans.admission.status().policy_version  # the policy this batch was generated with
        ids = GenerationBatchIds(namespace=settings.namespace, start=self._start, generation=self._generation,
                                 process_index=self.accelerator.process_index, group_size=self.num_generations)
        trajectories = generation_trajectories(output, sources=sources, ids=ids, policy_version=version)
        metas = rollout.submit_many(trajectories)
        rollout.flush()
        self._generation += 1
        self.submitted.extend(meta.trajectory_id for meta in metas)
        logger.info("submitted generation batch %d: %d trajectories at policy version %d", ids.generation,
                    len(metas), version)

    def generate_and_submit(self, *, until_version: int, poll_seconds: float = 0.05,
                            before_generation: Callable[[int], None] | None = None) -> int:
        """A rollout-only process: generate and submit generation batches until the trainers have advanced the
        policy to ``until_version``. A batch is generated whenever admission waits for data (too few ready
        groups, a source under its quota); while it waits for the trainers (the train batch is complete and
        ``max_batches_ahead`` holds the next one back) the rollout waits too, so it never runs further ahead of
        training than admission does. ``before_generation(version)`` runs before each batch: load that policy
        version's weights there (the trainers' checkpoints, or TRL's vLLM weight sync). Returns the trajectories
        submitted."""
        if self.knittrans.rollout is None:
            raise FailedPrecondition("this process has no rollout client")
        self.model.train()  # TRL generates in its training mode (num_generations, sampling)
        loader = self.get_train_dataloader()
        batches = iter(loader)
        before = len(self.submitted)
        while True:
            status = self.knittrans.admission.status()
            if status.policy_version >= until_version:
                return len(self.submitted) - before
            if status.blocking_reason not in WAITING_FOR_DATA:
                time.sleep(poll_seconds)
                continue
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            if before_generation is not None:
                before_generation(status.policy_version)
            self._generate_and_score_completions(batch)

    # ---- training: KnitTrans mini-batches into TRL's optimizer steps --------------------------------------

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        if self.knittrans.rollout is not None:
            self._prepare_inputs(inputs)  # TRL's schedule: generates (and submits) once per generation batch
        self._step += 1
        if self._step % self.current_gradient_accumulation_steps:
            # One optimizer step trains one whole KnitTrans mini-batch, on the last accumulation step (where the
            # gradients are synchronised); the others only keep TRL's generation schedule.
            return torch.zeros((), device=self.accelerator.device)
        model.train()
        return self._train_minibatch(model)

    def _next_minibatch(self) -> MiniBatch:
        client = self.knittrans.trainer
        if client is None:
            raise FailedPrecondition("this process has no trainer client: it only generates (generate_and_submit)")
        if self.knittrans.rollout is not None and self.accelerator.num_processes == 1:
            self._generate_until_admitted()
        if self._minibatches is None:
            mark_started(self.args.output_dir)  # a start after this one is a restart (resume_point)
            self._minibatches = client.mini_batches()
        mini = next(self._minibatches)
        self._last_sequence = mini.sequence
        return mini

    def _generate_until_admitted(self) -> None:
        """Colocated: TRL's one generation batch per optimizer step may not fill a train batch under the quotas
        (too few groups of a source). While admission waits for data and has nothing admitted for this step,
        generate more from a dataloader of our own (TRL's schedule itself is unchanged)."""
        while True:
            status = self.knittrans.admission.status()
            admitted = status.train_batch_index * status.num_minibatches + status.minibatch_index
            client = self.knittrans.trainer
            wanted = next_sequence(last_taken=self._last_sequence, num_minibatches=status.num_minibatches,
                                   restored=client.restored_step if client is not None else None)
            if admitted >= wanted or status.blocking_reason not in WAITING_FOR_DATA:
                return
            if self._extra_batches is None:
                self._extra_batches = iter(self.get_train_dataloader())
            try:
                batch = next(self._extra_batches)
            except StopIteration:
                self._extra_batches = iter(self.get_train_dataloader())
                batch = next(self._extra_batches)
            logger.info("admission waits for %s: generating another batch", status.blocking_reason)
            self._generate_and_score_completions(batch)

    def _train_minibatch(self, model: Any) -> torch.Tensor:
        while True:
            mini = self._next_minibatch()
            try:
                return self._forward_backward(model, mini)
            except MiniBatchRestarted:  # a TP rank of this consumer restarted: the mini-batch comes again, whole
                logger.warning("mini-batch %d restarted; training it again", mini.sequence)
                model.zero_grad()

    def _forward_backward(self, model: Any, mini: MiniBatch) -> torch.Tensor:
        self._current = mini
        world = self.accelerator.num_processes
        # DDP averages the gradients over the ranks; TRL's normaliser is the step's loss tokens / world size too.
        scale = world / max(mini.global_loss_tokens, 1)
        total = torch.zeros((), device=self.accelerator.device)
        loss_tokens, entropy_sum = 0, 0.0
        for micro in mini:
            self.inspect_micro_batch(mini, micro)
            sync = nullcontext() if micro.last or world == 1 else self.accelerator.no_sync(model)
            with sync:
                with self.compute_loss_context_manager(), self.accelerator.autocast():
                    result = micro_batch_loss(model, micro, self._loss_settings)
                    loss = result.loss_sum * scale
                self.accelerator.backward(loss)
            total += loss.detach()
            loss_tokens += result.loss_tokens
            entropy_sum += result.entropy_sum
        if loss_tokens:
            self._metrics["train"]["knittrans/entropy_local"].append(entropy_sum / loss_tokens)
        self._metrics["train"]["knittrans/minibatch"].append(float(mini.sequence))
        return total

    def inspect_micro_batch(self, mini: MiniBatch, micro: MicroBatch) -> None:
        """Called with each micro-batch before its forward pass; override to log or check what trains (its
        tensors are valid only during this step)."""

    def _complete_minibatch(self) -> None:
        mini, self._current = self._current, None
        if mini is None:
            return
        mini.complete()  # TP rank 0 reports the optimizer step; global rank 0 advances the policy version
        self.last_step = mini.step

    def _report_checkpoint(self, folder: Path) -> None:
        if self.last_step is None or not self.args.should_save:
            return
        write_restored_step(folder, self.last_step)
        self.knittrans.admission.report_checkpoint(self.last_step)
