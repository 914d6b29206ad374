"""The rank side of a multi-process gloo test (``tests.gloo_ranks.run_ranks`` launches it): parse the rank's
arguments, join the group, run the scenario, write ``rank<N>.json`` (a ``crash`` key holds a traceback), and
leave the group together with the other ranks. Worker scripts import it from their own folder."""

from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def run_worker(scenario: Callable[[argparse.Namespace], dict], *, extra: Callable[[argparse.ArgumentParser], None]
               = lambda parser: None, timeout_seconds: float = 60) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    extra(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=timeout_seconds))
    try:
        results = scenario(args)
    except Exception:
        results = {"crash": traceback.format_exc()}
    (args.out / f"rank{args.rank}.json").write_text(json.dumps(results))
    _leave_together()


def _leave_together() -> None:
    """Meet before tearing the group down: a rank that destroys its gloo pairs while a peer still uses them can
    abort at exit ("terminate called without an active exception"), which fails the launch."""
    try:
        dist.barrier()
    except Exception:  # a peer that crashed: its rank's result names the crash
        pass
    dist.destroy_process_group()
