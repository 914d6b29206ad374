"""Refuse encoders whose output for one input depends on the other inputs of its batch.

Deduplication changes which inputs share an encoder micro-batch (each unique input appears once instead of
once per consuming trajectory). That is invisible to an encoder whose outputs are per-sample functions of
its inputs, and changes the result of one that mixes statistics across samples. The detectable cases are
refused before any forward runs.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from knittrans.errors import InvalidArgument

CROSS_SAMPLE_STATE_ATTRIBUTE = "knittrans_cross_sample_state"
"""Set this attribute to True on a custom module whose training-mode output or state depends on the batch."""


def cross_sample_state_problems(encoder: nn.Module) -> list[str]:
    """One message per submodule that mixes samples in training mode; empty when the encoder is safe."""
    problems: list[str] = []
    for name, module in encoder.named_modules():
        if not module.training:
            continue
        label = name or type(encoder).__name__
        if isinstance(module, _BatchNorm):
            problems.append(
                f"{label} ({type(module).__name__}) normalises with the statistics of the whole encoder "
                "micro-batch in training mode, and deduplication changes that batch; put it in eval mode "
                "(running statistics), freeze it, or replace it with a per-sample norm such as LayerNorm"
            )
        elif isinstance(module, _InstanceNorm) and module.track_running_stats:
            problems.append(
                f"{label} ({type(module).__name__}) updates running statistics from the batch in training "
                "mode, and deduplication changes how often each input contributes; set "
                "track_running_stats=False or put it in eval mode"
            )
        elif getattr(module, CROSS_SAMPLE_STATE_ATTRIBUTE, False):
            problems.append(f"{label} ({type(module).__name__}) declares {CROSS_SAMPLE_STATE_ATTRIBUTE}=True")
    return problems


def check_encoder_supported(encoder: nn.Module) -> None:
    """Raise :class:`InvalidArgument` naming every submodule with cross-sample state in training mode."""
    problems = cross_sample_state_problems(encoder)
    if problems:
        raise InvalidArgument(
            "encoding deduplication needs an encoder without cross-sample state: " + "; ".join(problems),
            field="encoder",
        )
