"""Entry point of the TransferQueue arms of ``benchmarks/transfer.py``; the work is in ``benchmarks/tq/arm.py``.

Runs only inside the separate venv ``bench-out/tq-venv`` (``transferqueue==0.1.11``, whose wheel installs a
top-level ``tests`` package that would shadow ours); ``benchmarks/transfer_tq.py`` creates that venv and runs
this script with the workload as JSON. It reads one command per line on stdin (the arm, its warm-up and
measured steps) and answers each with one JSON line on ``--reply-fd`` (else stdout); progress goes to stderr.

    echo '{"arm": "b", "warmup_steps": 0, "steps": 1}' \
        | bench-out/tq-venv/bin/python benchmarks/transferqueue_arm.py --smoke
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tq.environment import prepare_process_environment


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--tq-log-level", default="ERROR")
    known, _ = early.parse_known_args(argv)
    prepare_process_environment(tq_log_level=known.tq_log_level)
    from tq.arm import main as arm_main  # only now: Ray and TransferQueue read the environment on import

    return arm_main(argv)


if __name__ == "__main__":
    sys.exit(main())
