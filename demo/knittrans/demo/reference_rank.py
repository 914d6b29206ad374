"""One rank of the demo's ``reference`` role (``knittrans demo --roles reference,actor``; docs/roles.md).

Run by the demo as ``python -m knittrans.demo.reference_rank --sidecar unix:… --admission … --store … …``, one
process per reference DP rank, each on its ``role:reference`` sidecar (cp 1: it holds whole sequences). It keeps
the actor's initial policy frozen (:func:`knittrans.demo.model.initial_model`, the same seed: the actor at step
0) and, for every packed micro-batch, attaches the label-aligned ``ref_logprobs``: row t of a trajectory's tensor
is log p_ref(labels[t]), 0 where there is no label (its last token). Then ``mini.complete()`` reports its "step".

A trainer role is planned on the text alone: its micro-batches carry no image, and the backbone runs without
encoder rows. So the demo's reference scores the text with each image's placeholder tokens left as they are
(their token embedding), where the actor puts its encoder's rows: the two differ by what the image adds, and
the actor's KL term does not start at 0.

So that the demo can check that the actor trained exactly these values, each rank appends one JSON line per
attached trajectory to ``reference-rank<d>.jsonl`` in the run's output directory: the mini-batch, the
trajectory, and the content hash and length of the bytes it attached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

REFERENCE_FIELD = "ref_logprobs"


def reference_records_path(out: Path, dp_rank: int) -> Path:
    return out / f"reference-rank{dp_rank}.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's role:reference sidecar")
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--store", required=True, help="the unit store the attached fields are written to")
    parser.add_argument("--namespace", required=True, help="the attached units' key prefix (the job)")
    parser.add_argument("--dp-rank", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0, help="the actor's initial-model seed")
    parser.add_argument("--steps", type=int, required=True, help="mini-batches to serve, then exit")
    parser.add_argument("--out", required=True, help="the run's output directory (records for the checks)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s reference{args.dp_rank} %(levelname)s %(name)s: %(message)s")
    import torch

    from knittrans.client.connection import ConnectionSettings
    from knittrans.demo.context_parallel import local_attention
    from knittrans.demo.model import initial_model, parameters_digest
    from knittrans.demo.training import label_logprobs
    from knittrans.store.hashing import content_hash
    from knittrans.trainer import TrainerClient, TrainerSettings

    torch.set_num_threads(1)
    model = initial_model(args.seed).requires_grad_(False)  # the actor's initial weights, never trained
    model.eval()  # no dropout (the demo's has none): a deterministic score
    out = Path(args.out)
    trainer = TrainerClient(TrainerSettings(
        sidecar=args.sidecar, global_rank=args.dp_rank, admission=ConnectionSettings(target=args.admission),
        store=args.store, namespace=args.namespace))
    records = open(reference_records_path(out, args.dp_rank), "a")
    records.write(json.dumps({"initial_policy": parameters_digest(model), "dp_rank": args.dp_rank}) + "\n")
    try:
        for step, mini in enumerate(trainer.mini_batches()):
            for micro in mini:
                input_ids = micro["input_ids"].to(torch.int64)
                if input_ids.numel() == 0:
                    continue
                positions = micro["position_ids"].to(torch.int64)
                with torch.no_grad():
                    # Text only: no encoder rows for the placeholders (a role gets no image).
                    logits = model.backbone(input_ids, position_ids=positions,
                                            attention=local_attention(positions, micro["cu_seqlens"]))
                    logprobs = label_logprobs(logits, micro["labels"].to(torch.int64))
                per_trajectory = [logprobs[rows].clone() for rows in micro.sequence_rows()]
                trainer.attach(micro, {REFERENCE_FIELD: per_trajectory}, alignment={REFERENCE_FIELD: "label"})
                for trajectory_id, values in zip(micro.trajectory_ids, per_trajectory, strict=True):
                    data = values.numpy().tobytes()
                    records.write(json.dumps({
                        "sequence": mini.sequence, "dp_rank": args.dp_rank, "trajectory": trajectory_id,
                        "hash": content_hash(data), "bytes": len(data)}) + "\n")
            records.flush()
            mini.complete()  # a producer-only role reports its "step": the mini-batch can be released
            if step + 1 >= args.steps:
                break
    finally:
        records.close()
        trainer.close()
    logger.info("attached %s to %d mini-batches", REFERENCE_FIELD, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
