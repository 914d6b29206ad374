"""TRL's ``GRPOTrainer`` through KnitTrans (``pip install 'knittrans[trl]'``; docs/integrations/trl.md)::

    clients = KnitTransClients(admission=admission, rollout=rollout, trainer=trainer_client)
    trainer = KnitTransGRPOTrainer(model=model, reward_funcs=reward, args=grpo_config, train_dataset=dataset,
                                   knittrans=clients, knittrans_settings=KnitTransGRPOSettings(sources=...))
    trainer.train()

Each generation batch goes through the unit store and the admission service; each optimizer step trains on the
mini-batch KnitTrans admitted and planned, from the rank's reorg sidecar, normalised by its
``global_loss_tokens``. Tested against trl==1.16.0, transformers==5.24.0, accelerate==1.15.0 (the ``trl`` extra
pins them)."""

from knittrans.integrations.trl.loss import LossType, PolicyLossSettings, micro_batch_loss
from knittrans.integrations.trl.resume import ResumePoint, restored_step, resume_point
from knittrans.integrations.trl.settings import (
    KnitTransGRPOSettings,
    TrainBatchShape,
    engine_config,
    trajectory_schema,
)
from knittrans.integrations.trl.trainer import KnitTransClients, KnitTransGRPOTrainer
from knittrans.integrations.trl.trajectories import GenerationBatchIds, generation_trajectories

__all__ = [
    "GenerationBatchIds",
    "KnitTransClients",
    "KnitTransGRPOSettings",
    "KnitTransGRPOTrainer",
    "LossType",
    "PolicyLossSettings",
    "ResumePoint",
    "TrainBatchShape",
    "engine_config",
    "generation_trajectories",
    "micro_batch_loss",
    "restored_step",
    "resume_point",
    "trajectory_schema",
]
