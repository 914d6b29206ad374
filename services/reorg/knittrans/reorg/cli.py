"""``knittrans reorg serve``: run one reorg sidecar until SIGTERM (then remove its segments and socket)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from knittrans.config import config_path_from_env, load_config
from knittrans.reorg.assignments import AdmissionAssignmentSource, WatchSettings
from knittrans.reorg.endpoint import serve_until_stopped, start_reorg
from knittrans.reorg.node_host import serve_node
from knittrans.reorg.settings import ReorgSettings
from knittrans.serving.heap import freeze_startup_heap
from knittrans.serving.server import run_until_signalled, write_ready_file
from knittrans.store.factory import open_store

logger = logging.getLogger(__name__)

TASKS = "/proc/self/task"  # one entry per thread of this process (Linux)


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Run a reorg sidecar for one (role, DP rank, CP rank): assignments in, packed micro-batches in shm out."""
    parser.add_argument("--config", help="YAML config file (default: $KNITTRANS_CONFIG)")
    parser.add_argument("--job", help="job name: prefixes shared-memory segments and the default socket "
                                      "(default: the admission service's job)")
    parser.add_argument("--role", help="backbone (default), encoder:<name>, or role:<name> (a trainer role)")
    parser.add_argument("--consumers", nargs="+", metavar="ROLE:DP:CP",
                        help="host these consumers in this process over one assignment stream (a node's "
                             "sidecars), e.g. backbone:0:0 backbone:0:1 encoder:vision:0:0; instead of "
                             "--role/--dp-rank/--cp-rank")
    parser.add_argument("--dp-rank", type=int)
    parser.add_argument("--cp-rank", type=int)
    parser.add_argument("--store", help="unit store URL: file:///dev/shm/..., mooncake://host:port, ray://")
    parser.add_argument("--admission", help="admission service address, host:port")
    parser.add_argument("--socket", help="Unix socket the trainer ranks dial (default: "
                                         "/tmp/knittrans-<job>/reorg-<role>-dp<D>-cp<C>.sock)")
    parser.add_argument("--slots", type=int, help="ring size K (default 4)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port; 0 picks a free one, -1 disables")
    parser.add_argument("--cpu-nice", type=int, help="CPU niceness, 0-19 (default 10: the trainer's work comes "
                                                     "first where they share cores)")
    parser.add_argument("--ready-file", type=Path, help="write {address, metrics_port, metrics_url, incarnation} "
                                                       "as JSON here once serving")
    return _run


def _run(args: argparse.Namespace) -> int:
    flags = {
        "job": args.job,
        "role": args.role,
        "dp_rank": args.dp_rank,
        "cp_rank": args.cp_rank,
        "store": args.store,
        "admission.target": args.admission,
        "server.unix_socket": args.socket,
        "ring.slots": args.slots,
        "consumers": tuple(args.consumers) if args.consumers else None,
        "server.metrics.port": args.metrics_port,
        "cpu_nice": args.cpu_nice,
    }
    settings = load_config(ReorgSettings, path=args.config or config_path_from_env(), flags=flags)
    lower_cpu_priority(settings.cpu_nice)  # before serving: the threads started then inherit it
    freeze_startup_heap()
    return run_until_signalled(lambda stop: serve(settings, stop, ready_file=args.ready_file))


def lower_cpu_priority(nice: int) -> None:
    """Make every thread of this process at least ``nice`` nice. Linux keeps niceness per thread: each thread
    already running (the runtime's, the import's) is set, and those started later inherit it from their creator.
    Raising niceness needs no privilege; lowering it does, so a thread that started nicer keeps its own."""
    threads = [int(t) for t in os.listdir(TASKS)] if os.path.isdir(TASKS) else [0]
    for thread in threads:
        try:
            if nice > os.getpriority(os.PRIO_PROCESS, thread):
                os.setpriority(os.PRIO_PROCESS, thread, nice)
        except ProcessLookupError:  # it ended meanwhile
            continue
        except PermissionError as error:  # a sandbox that forbids it: serve all the same, at the priority we have
            logger.warning("cannot set CPU niceness %d (%s); serving at niceness %d", nice, error,
                           os.getpriority(os.PRIO_PROCESS, 0))
            return
    logger.debug("CPU niceness %d for %d threads", nice, len(threads))


async def serve(settings: ReorgSettings, stop: asyncio.Event, *, ready_file: Path | None = None) -> int:
    link = settings.admission
    watch = WatchSettings(
        deadline=timedelta(seconds=link.deadline_seconds),
        give_up_after=timedelta(seconds=link.give_up_after_seconds) if link.give_up_after_seconds else None,
    )
    if len(settings.hosted_consumers) > 1:
        return await serve_node(settings, stop, watch, ready_file=ready_file)
    source = AdmissionAssignmentSource(link.connection(), settings.consumer, watch)
    if not settings.job:
        # Without --job, the sidecar belongs to the admission service's job: its socket is then where a trainer
        # of that job looks (/tmp/knittrans-<job>/...), and a file:// store without a path is that job's.
        try:
            registration = await source.register()
        except BaseException:
            await source.close()
            raise
        settings = replace(settings, job=registration.job or "default")
        logger.info("serving job %r (the admission service's)", settings.job)
    store = await asyncio.to_thread(open_store, settings.store, job=settings.job)
    try:
        running = await start_reorg(settings, source=source, store=store)
    except BaseException:
        await source.close()
        store.close()
        raise
    if ready_file is not None:
        write_ready_file(ready_file, running.announcement)
    return await serve_until_stopped([running], stop, settings.server.grace_seconds)
