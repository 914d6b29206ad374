"""The ``reference`` role: a frozen copy of the initial policy attaches ``ref_logprobs`` to every trajectory.

    python examples/roles/reference.py --admission unix:grpo.sock --store file:///dev/shm/knittrans-grpo-example \
        --sidecar unix:/tmp/knittrans-grpo-example/reorg-role_reference-dp0-cp0.sock --minibatches 2

(the PPO example runs it the same way with its own socket, store and sidecar: docs/roles.md, "Examples").

Each micro-batch arrives packed like the actor's. The reference scores ``labels[t]`` at every packed position t,
so its log-probs are label-aligned: row t of a trajectory's tensor is log p_ref(token t+1), and its last row (no
label) is 0. It attaches them per micro-batch (``alignment={"ref_logprobs": "label"}``: the actor's sidecar packs
them as they are, on the same positions as the actor's labels) and reports its "step" with ``mini.complete()``:
a producing role that does not train still tells the service it is done with the mini-batch, so it can be released.
"""

from __future__ import annotations

import argparse

import torch
from common import build_policy, label_logprobs

from knittrans.client.connection import ConnectionSettings
from knittrans.trainer import TrainerClient, TrainerSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", required=True, help="unix:/path of this rank's role:reference sidecar")
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--store", required=True, help="the unit store the attached fields are written to")
    parser.add_argument("--minibatches", type=int, default=2, help="mini-batches to serve, then exit")
    args = parser.parse_args()

    reference = build_policy().requires_grad_(False)  # the actor's initial weights, never trained
    trainer = TrainerClient(TrainerSettings(
        sidecar=args.sidecar, admission=ConnectionSettings(target=args.admission), store=args.store,
        namespace="reference", sidecar_timeout_seconds=120.0))  # the sidecar may still be starting
    try:
        for step, mini in enumerate(trainer.mini_batches()):
            for micro in mini:
                with torch.no_grad():
                    logprobs = label_logprobs(reference, micro)
                per_trajectory = [logprobs[rows].clone() for rows in micro.sequence_rows()]
                trainer.attach(micro, {"ref_logprobs": per_trajectory}, alignment={"ref_logprobs": "label"})
            mini.complete()
            print(f"reference: attached ref_logprobs to mini-batch {mini.sequence}")
            if step + 1 >= args.minibatches:
                break
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
