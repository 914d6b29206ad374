"""`knittrans admission serve`: run the admission service until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from knittrans.admission.service.settings import AdmissionServiceSettings
from knittrans.config import config_path_from_env, load_config

logger = logging.getLogger(__name__)


def register(parser: argparse.ArgumentParser):
    """Run the admission service (gRPC control plane)."""
    parser.add_argument("--config", help="YAML config file (default: $KNITTRANS_CONFIG)")
    parser.add_argument("--host", help="address to listen on (server.host)")
    parser.add_argument("--advertise-host", help="address clients dial, written to the ready file "
                                                 "(server.advertise_host; default: --host unless it is a wildcard)")
    parser.add_argument("--port", type=int, help="gRPC port, 0 for any free port (server.port)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics port, 0 for any (server.metrics.port)")
    parser.add_argument("--state", help="memory, or a redis:// URL for the journaled state")
    parser.add_argument("--store", help="unit store to delete released units from, e.g. file:///dev/shm/knittrans-job")
    parser.add_argument("--job", help="job name: names its journal, store paths and run directory; one service "
                                      "holds a job at a time")
    parser.add_argument("--ready-file", type=Path, help="write {address, metrics_port} as JSON here once serving")
    return run


def run(args: argparse.Namespace) -> int:
    settings = load_config(
        AdmissionServiceSettings,
        path=args.config or config_path_from_env(),
        flags={
            "server.host": args.host,
            "server.advertise_host": args.advertise_host,
            "server.port": args.port,
            "server.metrics.port": args.metrics_port,
            "state": args.state,
            "store": args.store,
            "job": args.job,
        },
    )
    from knittrans.admission.service.app import start_admission_service, tune_garbage_collector
    from knittrans.serving.server import run_until_signalled, write_ready_file

    async def main(stop: asyncio.Event) -> int:
        service = await start_admission_service(settings)
        tune_garbage_collector()
        ready = {"address": service.address, "metrics_port": service.server.metrics_port,
                 "metrics_url": service.server.metrics_url, "health_port": service.server.health_port}
        logger.info("admission service ready: %s", ready)
        if args.ready_file is not None:
            write_ready_file(args.ready_file, ready)
        stopping = asyncio.create_task(stop.wait())
        lost = asyncio.create_task(service.held_job.lost.wait())
        await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        lost.cancel()
        logger.info("shutting down")
        await service.stop()
        if service.held_job.lost.is_set():
            logger.error("%s", service.held_job.lost_error())
            return 1
        return 0

    return run_until_signalled(main)
