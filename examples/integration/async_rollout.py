"""How an asyncio rollout server (sglang- or vLLM-style) hands finished trajectories to KnitTrans.

    python examples/integration/async_rollout.py --admission unix:admission.sock \
        --store file:///dev/shm/knittrans-quickstart [--count 8] [--sources math,code] [--concurrency 4]

The server below is a stand-in: each request is a coroutine that "generates" a response (an ``asyncio.sleep``
where your engine awaits its generation) and then awaits ``AsyncRolloutClient.submit``. Up to ``--concurrency``
requests are in flight at once, and their submits overlap: splitting a trajectory and the store's blocking writes
run in an executor, and the metadata goes to the admission service on grpc.aio, so the event loop that serves
requests never blocks on KnitTrans. A trajectory the service rejects (try ``--sources poetry``) fails its own
submit, naming the field, and its units are removed from the store.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from knittrans.aio import AsyncAdmissionClient, AsyncRolloutClient
from knittrans.client.connection import ClientTlsSettings, ConnectionSettings
from knittrans.store.factory import open_store
from knittrans.types import VersionSegment


async def serve_request(rollout: AsyncRolloutClient, index: int, *, sources: list[str], policy_version: int,
                        slots: asyncio.Semaphore) -> None:
    async with slots:
        rng = np.random.default_rng(index)
        sample = index // 4  # a GRPO group of 4 responses shares its prompt
        prompt, response = 12, int(rng.integers(20, 60))
        await asyncio.sleep(0.01 * float(rng.random()))  # your engine's generation
        tokens = prompt + response
        meta = await rollout.submit(
            {
                "input_ids": rng.integers(0, 32000, tokens, dtype=np.int32),
                "loss_mask": (np.arange(tokens) >= prompt).astype(np.uint8),  # token-aligned, verl's response_mask
                "logprobs": np.where(np.arange(tokens) >= prompt, -rng.random(tokens), 0).astype(np.float32),
                "reward": float(rng.random()),
            },
            field_alignment={"loss_mask": "token", "logprobs": "token"},
            trajectory_id=f"async-example-{index}",
            sample_id=f"async-example-sample-{sample}",
            source=sources[sample % len(sources)],
            rollout_step=policy_version,
            segments=(VersionSegment(version=policy_version, num_tokens=response),),
        )
        print(f"submitted {meta.trajectory_id}: {meta.num_tokens} tokens ({meta.num_loss_tokens} in the loss)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admission", required=True, help="the admission service: host:port or unix:PATH")
    parser.add_argument("--store", required=True, help="unit store URL (file://, mooncake://, ray://)")
    parser.add_argument("--token", default="", help="bearer token, when the service requires one")
    parser.add_argument("--ca-file", default="", help="CA certificate, when the service uses TLS")
    parser.add_argument("--count", type=int, default=8, help="trajectories to submit (groups of 4)")
    parser.add_argument("--sources", default="math,code", help="data sources to cycle through (the job's)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests served at once")
    args = parser.parse_args()

    connection = ConnectionSettings(target=args.admission, token=args.token,
                                    tls=ClientTlsSettings(ca_file=args.ca_file))
    store = open_store(args.store)
    try:
        # Open the async admission client inside the event loop that uses it (its channel belongs to the loop).
        async with AsyncAdmissionClient(connection) as admission:
            policy_version = (await admission.status()).policy_version
            rollout = AsyncRolloutClient(store, namespace="example", reporter=admission)
            slots = asyncio.Semaphore(args.concurrency)
            # A server lets every request finish, whatever another one's submit raised.
            outcomes = await asyncio.gather(*(
                serve_request(rollout, i, sources=args.sources.split(","), policy_version=policy_version,
                              slots=slots)
                for i in range(args.count)), return_exceptions=True)
            failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            if failures:
                raise failures[0]
            status = await admission.status()  # every submit was reported when it returned
            print(f"admission: pool {status.pool_size}, admitted {status.admitted_total}, "
                  f"waiting: {status.blocking_reason}")
    finally:
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
