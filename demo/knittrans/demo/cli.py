"""`knittrans demo`: the whole pipeline on one machine, on the embedded defaults."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from knittrans.config import load_config
from knittrans.launch.interruptions import raise_stop

if TYPE_CHECKING:
    from knittrans.demo.stack.namespaces import Node
    from knittrans.demo.stack.settings import DemoSettings


def register(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Run the full local stack: admission, sidecars, trainer ranks and rollout workers."""
    parser.add_argument("--config", help="YAML file of demo settings (see knittrans.demo.stack.settings)")
    parser.add_argument("--store", choices=["file", "mooncake"], help="unit store (default: file under /dev/shm)")
    parser.add_argument("--state", choices=["memory", "redis"], help="admission state (default: memory)")
    parser.add_argument("--policy", help="admission policy: knittrans, linear, train-batch, stream, no-guard")
    parser.add_argument("--train-batches", type=int, help="train batches to run")
    parser.add_argument("--out", help="output directory (default demo-out, or demo-out-<job> while another run "
                                      "uses demo-out)")
    parser.add_argument("--job", help="job id: names the run's store keys, segments, sockets and journal "
                                      "(default: a fresh demo-<random> per run)")
    parser.add_argument("--nodes", type=int, choices=[1, 3],
                        help="3: run on three network hosts (Linux network namespaces, root); implies --store mooncake")
    parser.add_argument("--chaos", type=int, metavar="SEED",
                        help="run under a seeded schedule of kill -9 and SIGSTOP/SIGCONT, restarting what dies, and "
                             "check the outcome from outside; implies --state redis --store mooncake")
    parser.add_argument("--chaos-targets", metavar="LIST",
                        help="comma-separated fault targets: admission, redis, sidecar, trainer, rollout, "
                             "mooncake-store (default: all)")
    parser.add_argument("--roles", metavar="LIST",
                        help="trainer roles: actor (the default) or reference,actor (a frozen reference attaches "
                             "ref_logprobs, the actor adds a KL term; docs/roles.md)")
    return _run


class StopSignal(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run stops as on Ctrl-C (every ``except KeyboardInterrupt`` and ``finally`` runs)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM (a CI runner, Kubernetes, ``timeout``) stops the run as Ctrl-C does; once one came, later ones are
    ignored, so that they cannot cut the clean-up short. (Its processes also die with it if it is killed:
    :mod:`knittrans.launch.lifetime`.)"""
    stopping = [False]

    def handle(signum: int, _frame: object) -> None:
        if not stopping[0]:
            stopping[0] = True
            raise_stop(StopSignal(signum))  # held back while a child's start is half done

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stopped(interrupt: KeyboardInterrupt, what: str) -> int:
    """Say which signal stopped the run; its status is the shell's for that signal (130 for Ctrl-C, 143 for
    SIGTERM)."""
    signum = interrupt.signum if isinstance(interrupt, StopSignal) else signal.SIGINT
    print(f"\nknittrans demo: stopped by {signal.Signals(signum).name}; {what}", file=sys.stderr)
    return 128 + signum


def _run(args: argparse.Namespace) -> int:
    with stop_on_signals():
        return _run_settings(args)


def _run_settings(args: argparse.Namespace) -> int:
    from knittrans.demo.chaos.schedule import parse_targets
    from knittrans.demo.stack.settings import DemoSettings
    from knittrans.errors import FailedPrecondition

    several_nodes = args.nodes is not None and args.nodes > 1
    chaos = args.chaos is not None
    settings = load_config(
        DemoSettings,
        path=args.config,
        env={},  # the demo's own settings come from its file and flags; KNITTRANS_* belong to the services
        flags={"store": args.store or ("mooncake" if several_nodes or chaos else None),
               "state": args.state or ("redis" if chaos else None),
               "policy": args.policy, "train_batches": args.train_batches, "out": args.out, "nodes": args.nodes,
               "job": args.job, "chaos.seed": args.chaos,
               "chaos.targets": list(parse_targets(args.chaos_targets)) if args.chaos_targets else None,
               "roles": args.roles.split(",") if args.roles is not None else None},
    )
    if settings.chaos.enabled:
        return run_chaos_and_summarize(settings)
    if settings.nodes > 1:
        from knittrans.demo.stack.cluster import run_cluster_demo

        try:
            return run_cluster_demo(settings)
        except FailedPrecondition as failure:  # no namespaces here (not root, no `ip`): says why
            print(f"\nknittrans demo: {failure}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as interrupt:
            return _stopped(interrupt, "every node was torn down")
    return run_and_summarize(settings)


def run_chaos_and_summarize(settings: DemoSettings) -> int:
    """The chaos run: a JSON summary on stdout, then one line that says whether it passed."""
    import json

    from knittrans.demo.chaos.run import run_chaos_demo
    from knittrans.errors import FailedPrecondition
    from knittrans.stack.processes import ProcessFailed

    try:
        report = run_chaos_demo(settings)
    except (ProcessFailed, FailedPrecondition) as failure:
        print(f"\nknittrans demo: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        return _stopped(interrupt, "every process was stopped")
    print(json.dumps(report.summary(), indent=2))
    print(report.line())
    return 0 if report.verdict.passed else 1


def run_and_summarize(settings: DemoSettings, nodes: Sequence[Node] = ()) -> int:
    """Run the demo (here, or as the driver on node0 of the multi-node layout) and print its checks."""
    from knittrans.demo.stack.run import run_demo
    from knittrans.errors import FailedPrecondition
    from knittrans.stack.processes import ProcessFailed

    try:
        report = run_demo(settings, nodes)
    except ProcessFailed as failure:
        print(f"\nknittrans demo: a process failed: {failure}", file=sys.stderr)
        return 1
    except FailedPrecondition as failure:  # a backend (Redis, Mooncake) that could not start says why
        print(f"\nknittrans demo: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        return _stopped(interrupt, "every process was stopped")
    out = Path(report.out)
    checks = report.checks
    print(f"\nbytes read by the sidecars: {report.bytes_read:,}  needed by the plans: {report.bytes_needed:,}")
    names = ["trained_exactly_once", "quotas_held", "bytes_match", "images_match", "loss_decreased"]
    if checks.reference_fields_match is not None:
        names.append("reference_fields_match")
    for name in names:
        print(f"  {name.replace('_', ' ')}: {'yes' if getattr(checks, name) else 'NO'}")
    print(f"loss per train batch: {checks.details.get('loss_by_train_batch')}")
    if "store_keys_after_release" in checks.details:
        print(f"units left in the store after the last step: {checks.details['store_keys_after_release']}")
    print(f"wrote {out / 'report.json'} and {out / 'report.png'}")
    released = checks.details.get("store_keys_after_release", 0) == 0
    return 0 if checks.passed and released else 1
