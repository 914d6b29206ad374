"""How a rollout worker of any RL framework hands finished trajectories to KnitTrans.

    python examples/integration/rollout_worker.py --admission unix:admission.sock \
        --store file:///dev/shm/knittrans-quickstart [--count 8] [--sources math,code] [--encoder vision] \
        [--token TOKEN] [--ca-file ca.pem]
    python examples/integration/rollout_worker.py [--count 8]   # the stack `knittrans up` runs

``--admission`` is the service's address (host:port, or unix:PATH as in the local quick start of
docs/integration.md); ``--store`` is the unit store the trainers' sidecars read from. Without them, both come
from the connection file of the stack ``knittrans up`` runs (docs/own-trainer.md). The sources must be the
job's (its config's ``engine.sources``); with ``--encoder``, each GRPO group shares one image for that encoder,
which the job's topology must declare, with a sidecar running for it.

``RolloutClient.submit`` does both halves in one call: it splits the trajectory into atomic units and writes
them to the unit store, then hands the metadata to a ``BatchingReporter``, which reports it to the (possibly
remote) admission service in batches, retrying while the service is unavailable. A trajectory the service rejects
(a source or an encoder the job does not have, say) fails that submit, or the next one, and its units are removed
from the store. Call it from wherever your framework sees a finished response (verl's rollout worker, slime's
``generate`` callback, ...).
"""

from __future__ import annotations

import argparse

import numpy as np

from knittrans.client.admission import AdmissionClient
from knittrans.client.connection import ClientTlsSettings, ConnectionSettings
from knittrans.client.reporter import BatchingReporter
from knittrans.rollout import MultimodalInput, RolloutClient
from knittrans.store.factory import open_store
from knittrans.types import TokenSpan, VersionSegment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admission", help="the admission service: host:port or unix:PATH "
                                            "(default: from the connection file of `knittrans up`)")
    parser.add_argument("--store", help="unit store URL (file://, mooncake://, ray://; default: as --admission)")
    parser.add_argument("--token", default="", help="bearer token, when the service requires one")
    parser.add_argument("--ca-file", default="", help="CA certificate, when the service uses TLS")
    parser.add_argument("--count", type=int, default=8, help="trajectories to submit (groups of 4)")
    parser.add_argument("--sources", default="math,code", help="data sources to cycle through (the job's)")
    parser.add_argument("--encoder", default="", help="give each group an image for this encoder (default: none)")
    args = parser.parse_args()

    if bool(args.admission) != bool(args.store):
        parser.error("give both --admission and --store, or neither (the stack `knittrans up` runs)")
    sources = args.sources.split(",")
    rng = np.random.default_rng(0)
    if args.admission:
        admission = AdmissionClient(ConnectionSettings(target=args.admission, token=args.token,
                                                       tls=ClientTlsSettings(ca_file=args.ca_file)))
        store = open_store(args.store)
        # close() flushes the reporter (every trajectory is then acknowledged by the service) and closes the store.
        reporter = BatchingReporter(admission)
        rollout = RolloutClient(store, namespace="example", reporter=reporter, closes=(reporter, store))
    else:  # the stack of `knittrans up`: its connection file names the service and the store
        admission = AdmissionClient.from_env()
        rollout = RolloutClient.from_env(namespace="example")
    with admission, rollout:
        policy_version = admission.status().policy_version  # the version the rollout engine generates with
        for i in range(args.count):
            sample = i // 4  # a GRPO group of 4 responses shares its prompt (and its image)
            prompt, response = 12, int(rng.integers(20, 60))
            images = (MultimodalInput(data=np.full((16, 16, 3), sample, np.uint8), encoder=args.encoder, cost=4.0,
                                      placeholder=TokenSpan(start=2, end=6)),) if args.encoder else ()
            tokens = prompt + response
            meta = rollout.submit(
                {
                    "input_ids": rng.integers(0, 32000, tokens, dtype=np.int32),
                    # verl's response_mask over the whole sequence: 1 on each response token itself.
                    "loss_mask": (np.arange(tokens) >= prompt).astype(np.uint8),
                    # The rollout's log-prob of each token itself (0 on the prompt), as verl and slime keep it.
                    "logprobs": np.where(np.arange(tokens) >= prompt, -rng.random(tokens), 0).astype(np.float32),
                    "reward": float(rng.random()),
                },
                # Both describe token t itself: the sidecar shifts them to line up with the labels (the next
                # token). "token" is also the loss mask's default; docs/integration.md has the convention.
                field_alignment={"loss_mask": "token", "logprobs": "token"},
                trajectory_id=f"example-{i}",
                sample_id=f"example-sample-{sample}",
                source=sources[sample % len(sources)],
                rollout_step=policy_version,
                segments=(VersionSegment(version=policy_version, num_tokens=response),),
                multimodal=images,
            )
            print(f"submitted {meta.trajectory_id}: {meta.num_tokens} tokens ({meta.num_loss_tokens} in the loss), "
                  f"{len(meta.units)} units")
        rollout.close()  # flush: every trajectory is acknowledged by the service when this returns
        status = admission.status()
        print(f"admission: pool {status.pool_size}, admitted {status.admitted_total}, "
              f"waiting: {status.blocking_reason}")


if __name__ == "__main__":
    main()
