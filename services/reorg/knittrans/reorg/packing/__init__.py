"""Packing one consumer's micro-batch into training inputs (pure: numpy only, no I/O, no clock).

A backbone micro-batch is packed THD-style for one CP rank (the layout :mod:`knittrans.train.plan_adapter`
assumes): its items in plan order, each contributing its CP rank's two zigzag chunks (chunk r, then chunk
2cp−1−r) at their padded length, ``padded_tokens / cp`` tokens per item; the whole stream is then padded
to ``pack_multiple``. Tensors, each at a 64-byte-aligned offset of one buffer (a shared-memory slot):

- one tensor per per-token field, named after the field, ``[T, *per_token_shape]`` in the stored dtype
  (padding rows: ``pad_token_id`` for the tokens field, 0 otherwise);
- ``labels`` (int64 ``[T]``): the next token of the tokens field, ``label_ignore_index`` where there is none
  (sequence end, padding). Other label fields get ``<field>.next``;
- ``position_ids`` (int64 ``[T]``): global positions of the zigzag chunks (padded coordinates), so every CP
  rank sees the positions the tokens have in the whole sequence;
- ``cu_seqlens`` (int32 ``[n+1]``): item boundaries in the packed stream; ``cu_seqlens_global`` (int32
  ``[n+1]``): boundaries of the padded sequences before the CP split (what THD attention with CP wants);
  ``seq_lengths`` (int32 ``[n]``): real lengths;
- per response-only field (:class:`~knittrans.types.Coverage`, rows for tokens ``[response_start, num_tokens)``
  only): the field at full length as if stored over the whole sequence with 0 over the prompt, and
  ``<field>.mask`` (uint8 ``[T]``): 1 exactly where the packed value is a stored one (0 over the prompt, at a
  shifted field's last real token, on padding). 0 rather than NaN, so masked sums stay finite;
- one tensor per non-sequence field, ``[n, *shape]``;
- per scalar that any item of the micro-batch has: ``scalar.<name>`` (float64 ``[n]``, NaN for an item that
  lacks it) and ``scalar_present.<name>`` (uint8 ``[n]``, 1 where the item has it). Trajectories of one job
  may carry different scalar sets (a reward model that scores some of them, say); the mask tells a missing
  value from a reported NaN.

**Alignment.** Every per-target field reaches the trainer *label-aligned*, like ``labels``: packed position t
carries what concerns the prediction of ``labels[t]``. A unit the rollout declared token-aligned
(:class:`~knittrans.types.FieldAlignment`) is shifted left by one inside its trajectory (packed ``[t]`` =
stored ``[t+1]``, 0 at the last real token), which needs the token after each CP chunk: the planner reads it
with one token of look-ahead, as it does for label fields. A label-aligned or undeclared unit is packed as
stored. The loss mask (``loss_mask_field``) is also 0 at each trajectory's last real token, whose label is
ignored; without a stored one it is generated (uint8, 1 on every real token that has a label). So
``count_nonzero(loss_mask)`` over all ranks is exactly the positions the loss uses, which the rollout reported
as ``num_loss_tokens`` and the planner sums into the mini-batch's global loss-token count.

The work is split so that the bytes can be read *straight into place*: :func:`backbone_layout` (in
:mod:`.layout`) says where every read lands (directly in its final tensor where the packed layout keeps the
read's bytes contiguous, otherwise in a scratch buffer), the reader moves the bytes, and :func:`fill_backbone`
(in :mod:`.fill`) writes the rest (padding, labels, positions, boundaries, scratch copies).
:func:`pack_backbone` runs the three steps on bytes already in memory.

Encoder micro-batches hold unique multimodal inputs, read whole into ``inputs`` (``[n, *shape]`` when all
share dtype and shape, otherwise ``inputs.<k>`` each).
"""

from knittrans.reorg.packing.fill import fill_backbone, pack_backbone
from knittrans.reorg.packing.layout import (
    ENCODER_INPUTS,
    Destination,
    PackLayout,
    PackSettings,
    ReadPlacement,
    backbone_layout,
    encoder_layout,
    label_tensor_name,
    mask_tensor_name,
    tensor_view,
)

# Callers and tests name the generated tensors through the packer, whose layout they are.
from knittrans.tensor_names import CU_SEQLENS, CU_SEQLENS_GLOBAL, LABELS, POSITION_IDS, SEQ_LENGTHS

__all__ = [
    "CU_SEQLENS",
    "CU_SEQLENS_GLOBAL",
    "ENCODER_INPUTS",
    "LABELS",
    "POSITION_IDS",
    "SEQ_LENGTHS",
    "Destination",
    "PackLayout",
    "PackSettings",
    "ReadPlacement",
    "backbone_layout",
    "encoder_layout",
    "fill_backbone",
    "label_tensor_name",
    "mask_tensor_name",
    "pack_backbone",
    "tensor_view",
]
