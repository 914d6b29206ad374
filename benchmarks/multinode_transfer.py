"""Exposed transfer per step across network hosts at a bandwidth-limited link: KnitTrans iter against eager.

Three network hosts in Linux network namespaces (root only; knittrans.demo.stack.namespaces), laid out as a job
would be: node0 runs the admission service and the Mooncake master; node1 the only Mooncake segment, so every
unit lives there; node2 the reorg sidecars, the trainer ranks and this benchmark's driver. Every byte the
sidecars read crosses the link into node2, which ``tc qdisc ... tbf`` limits to each ``--rates`` entry (on the
bridge's port towards node2; netem does not work here). The driver writes each step's units into node1's
segment (not timed).

The arms are :mod:`transfer_knittrans`'s, on :mod:`transfer_workload`'s step, sized down by default to fit a few
minutes (``--help`` lists the knobs): ``iter`` (consumption-driven delivery with prefetch) and ``eager`` (the
whole mini-batch is materialised before the first micro-batch). Per step:

- ``exposed_from_report_s``: from the report of the step's last trajectory to the admission service (its other
  trajectories reported before it) until every rank of a DP group
  holds its first micro-batch (in eager mode: its whole mini-batch), plus the group's later waits for data;
  the largest group's;
- ``exposed_transfer_s``: the same from the group's dispatch on (:mod:`transfer_knittrans`'s definition,
  without the control plane's report-to-dispatch latency).

Arms are interleaved: each round runs every rate and, per rate, both arms (the order alternates between
rounds), each ``--warmup-steps`` then ``--steps`` steps. Figures are medians over every measured step of every
round. JSON on stdout (``"skipped"`` with the reason and exit 2 where namespaces cannot be built), progress on
stderr.

    sudo python benchmarks/multinode_transfer.py [--rounds 2] [--steps 3] [--rates 1gbit,unlimited]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transfer_accounting import describe
from transfer_workload import WorkloadConfig, add_workload_arguments, build_workload

from knittrans.trainer import DeliveryMode

logger = logging.getLogger("multinode_transfer")

MIB = 1 << 20
TRAINER_NODE = 2
# The default step: the transfer benchmark's shape (per-token fields, images, DP x CP, simulated compute per token)
# with half its trajectories' length and a quarter of their number, on DP=2 x CP=2 x TP=1: about 20 MB a step.
MULTINODE = WorkloadConfig(num_prompts=8, rollouts_per_prompt=8, mean_tokens=4096, max_tokens=16384, min_tokens=256,
                           images_per_prompt=2, image_height=224, image_width=224, dp=2, tp=1, cp=2,
                           max_tokens_per_micro_batch=16384, reader_concurrency=4)


def shape(bridge_netns: str, port: str, rate: str | None) -> None:
    """Limit what the bridge sends out of ``port`` (the link into its node) to ``rate``; None: unlimited."""
    subprocess.run(["tc", "-n", bridge_netns, "qdisc", "del", "dev", port, "root"], capture_output=True)
    if rate is not None:
        subprocess.run(["tc", "-n", bridge_netns, "qdisc", "add", "dev", port, "root", "tbf", "rate", rate,
                        "burst", "256kb", "latency", "50ms"], check=True)


def drive(layout: Path, bridge_netns: str, options: dict[str, Any]) -> dict[str, Any]:
    """On node2: the data plane and the admission service on their nodes, the sidecars here, then the rounds."""
    from transfer_knittrans import run_arm
    from transfer_knittrans_cluster import Placement, start_cluster

    from knittrans.demo.stack.namespaces import Node
    from knittrans.launch.mooncake import MooncakeClusterConfig, start_master, start_segment_owner

    nodes = [Node(**node) for node in json.loads(layout.read_text())]
    config = WorkloadConfig.from_dict(options["workload"])
    workload = build_workload(config)
    directory = Path(tempfile.mkdtemp(prefix="kt-multinode-transfer-"))
    segment = options["segment_mib"] * MIB
    master = start_master(MooncakeClusterConfig(segment_size=segment), bind_host=nodes[0].address,
                          log_dir=directory / "mooncake", command_prefix=nodes[0].enter())
    owner = start_segment_owner(master.address, segment_size=segment, bind_host=nodes[1].address,
                                log_dir=directory / "mooncake", command_prefix=nodes[1].enter())
    url = f"mooncake://{master.address}?max_unit_size={segment}"
    placement = Placement(admission_prefix=tuple(nodes[0].enter()), admission_host=nodes[0].address,
                          admission_store_url=f"{url}&local_hostname={nodes[0].address}",
                          sidecar_store_url=f"{url}&local_hostname={nodes[TRAINER_NODE].address}")
    port = f"veth{TRAINER_NODE}"
    cluster = None
    steps: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        started = time.perf_counter()
        cluster = start_cluster(config, store="mooncake", directory=directory, slots=options["slots"],
                                encoder_microbatch_images=options["encoder_microbatch_images"], placement=placement)
        logger.info("cluster ready in %.1f s: %d sidecars on node2, admission on node0, segment on node1",
                    time.perf_counter() - started, len(cluster.sidecars))
        modes = [DeliveryMode.EAGER, DeliveryMode.ITER]
        first_step = 0
        for round_index in range(options["rounds"]):
            for rate in options["rates"]:
                shape(bridge_netns, port, None if rate == "unlimited" else rate)
                for mode in modes if round_index % 2 == 0 else modes[::-1]:
                    logger.info("round %d, %s link, %s", round_index, rate, mode.value)
                    report = run_arm(cluster, workload, mode, first_step=first_step,
                                     warmup_steps=options["warmup_steps"], steps=options["steps"],
                                     prefetch=options["prefetch"])
                    first_step += options["warmup_steps"] + options["steps"]
                    steps.setdefault(rate, {}).setdefault(mode.value, []).extend(
                        {**step, "round": round_index} for step in report["steps"])
    finally:
        shape(bridge_netns, port, None)
        if cluster is not None:
            cluster.stop()
        owner.stop()
        master.stop()
    return {"steps": steps, "logs": str(directory)}


def summarise(steps: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    links: dict[str, Any] = {}
    for rate, arms in steps.items():
        figures: dict[str, Any] = {}
        for mode, measured in arms.items():
            def median(key: str, rows: list[dict[str, Any]] = measured) -> float:
                return round(statistics.median(row[key] for row in rows), 4)

            figures[mode] = {
                "exposed_from_report_s": median("exposed_from_report_s"),
                "exposed_transfer_s": median("exposed_transfer_s"),
                "report_to_dispatch_s": median("report_to_dispatch_s"),
                "step_s": median("step_s"),
                "bytes_moved_per_step": int(statistics.median(row["bytes_moved_from_storage"] for row in measured)),
                "measured_steps": len(measured),
            }
        if {"eager", "iter"} <= figures.keys():
            for key in ("exposed_from_report_s", "exposed_transfer_s"):
                figures[f"{key}_eager_over_iter"] = round(
                    figures["eager"][key] / max(figures["iter"][key], 1e-9), 2)
        links[rate] = figures
    return links


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if argv and argv[0] == "node-drive":
        layout, bridge_netns, options = argv[1:4]
        print(json.dumps(drive(Path(layout), bridge_netns, json.loads(options))))
        return 0

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)  # --smoke starts from transfer_workload's smoke step instead of MULTINODE
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=1, help="per arm and round, not measured")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per arm and round")
    parser.add_argument("--rates", default="1gbit,unlimited", help="tbf rates of the link into node2, or `unlimited`")
    parser.add_argument("--slots", type=int, default=2, help="ring slots per sidecar")
    parser.add_argument("--prefetch", type=int, default=1, help="micro-batches each trainer stages ahead")
    parser.add_argument("--encoder-microbatch-images", type=int, default=16)
    parser.add_argument("--segment-mib", type=int, default=1024, help="node1's Mooncake segment")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    arguments = parser.parse_args(argv)

    from transfer_workload import SMOKE

    from knittrans.demo.stack.namespaces import NamespaceCluster, namespaces_unavailable

    base = SMOKE if arguments.smoke else MULTINODE
    config = dataclasses.replace(base, **{
        name: value for name in (f.name for f in dataclasses.fields(WorkloadConfig))
        if (value := getattr(arguments, f"workload_{name}")) is not None})
    reason = namespaces_unavailable()
    if reason:
        print(json.dumps({"benchmark": "multinode_transfer", "skipped": reason}))
        return 2
    rates = [rate.strip() for rate in arguments.rates.split(",") if rate.strip()]
    options = {"workload": config.to_dict(), "rounds": arguments.rounds, "warmup_steps": arguments.warmup_steps,
               "steps": arguments.steps, "rates": rates, "slots": arguments.slots, "prefetch": arguments.prefetch,
               "encoder_microbatch_images": arguments.encoder_microbatch_images,
               "segment_mib": arguments.segment_mib}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kt-multinode-transfer-") as scratch, NamespaceCluster() as cluster:
        layout = Path(scratch) / "layout.json"
        layout.write_text(json.dumps([asdict(node) for node in cluster.nodes]))
        driver = subprocess.run(
            cluster.nodes[TRAINER_NODE].command([sys.executable, str(Path(__file__).resolve()), "node-drive",
                                                 str(layout), cluster.bridge_netns, json.dumps(options)]),
            stdout=subprocess.PIPE, text=True, env={**os.environ, "GLOG_minloglevel": "1"},  # Mooncake's info lines
        )
    if driver.returncode != 0:
        return 1
    result = json.loads(driver.stdout.strip().splitlines()[-1])  # Mooncake may print too
    document = {
        "benchmark": "multinode_transfer: exposed transfer per step across nodes, KnitTrans iter vs eager",
        "layout": "admission + Mooncake master on node0, the only segment on node1, sidecars + trainer ranks + "
                  "driver on node2; tbf on the link into node2 (network namespaces)",
        "workload": describe(build_workload(config)),
        "rounds": arguments.rounds, "warmup_steps_per_arm_and_round": arguments.warmup_steps,
        "measured_steps_per_arm_and_round": arguments.steps, "prefetch": arguments.prefetch,
        "links": summarise(result["steps"]),
        "steps": result["steps"],
        "logs": result["logs"],
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    text = json.dumps(document, indent=2)
    if arguments.output:
        arguments.output.parent.mkdir(parents=True, exist_ok=True)
        arguments.output.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
