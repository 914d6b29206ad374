"""Launcher of the TransferQueue arms of ``benchmarks/transfer.py``, from the main venv.

TransferQueue 0.1.11 runs in a venv of its own, ``bench-out/tq-venv`` (its wheel installs a top-level ``tests``
package that would shadow ours). :func:`run_transferqueue_arms` creates that venv when missing, runs
``transferqueue_arm.py`` in it with the same :class:`~transfer_workload.WorkloadConfig`, and returns its JSON
as a dict. Nothing here imports TransferQueue.

    python benchmarks/transfer_tq.py --smoke          # fast; prints JSON on stdout, progress on stderr
    python benchmarks/transfer_tq.py                  # the issue's full-size step
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import venv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transfer_workload import WorkloadConfig, add_workload_arguments, config_from_arguments

logger = logging.getLogger("transfer_tq")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO_ROOT / "bench-out" / "tq-venv"
ARM_SCRIPT = Path(__file__).resolve().with_name("transferqueue_arm.py")

TRANSFERQUEUE_REQUIREMENT = "transferqueue==0.1.11"
# TransferQueue imports torch (directly and through tensordict). Installing the pinned CPU build first, and
# constraining the second install to it, keeps pip from pulling a multi-GB CUDA build.
TORCH_REQUIREMENT = "torch==2.13.0"
_READY_STAMP = ".knittrans-tq-ready"


class TransferQueueArmError(RuntimeError):
    """The TransferQueue venv could not be made, or the arm failed."""


def _arm_environment() -> dict[str, str]:
    """The arm's environment: the SDK's sources on its path, for the zigzag arithmetic transfer_placement shares
    with the plan (knittrans.plan.geometry needs numpy only, which the venv has)."""
    sdk = str(REPO_ROOT / "clients" / "python")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{sdk}{os.pathsep}{path}" if path else sdk}


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def ensure_tq_venv(venv_dir: Path = DEFAULT_VENV) -> Path:
    """Create (or finish) the TransferQueue venv; returns its python. A no-op once it is ready."""
    stamp = venv_dir / _READY_STAMP
    wanted = f"{TORCH_REQUIREMENT}\n{TRANSFERQUEUE_REQUIREMENT}\nnumpy\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return _venv_python(venv_dir)
    if not _venv_python(venv_dir).exists():
        logger.info("creating the TransferQueue venv at %s", venv_dir)
        venv.EnvBuilder(with_pip=True, clear=False).create(venv_dir)
    python = str(_venv_python(venv_dir))
    constraints = venv_dir / "constraints.txt"
    constraints.write_text(f"{TORCH_REQUIREMENT}\n")
    steps = [
        [python, "-m", "pip", "install", "-q", TORCH_REQUIREMENT],
        [python, "-m", "pip", "install", "-q", "-c", str(constraints), TRANSFERQUEUE_REQUIREMENT, "numpy"],
        [python, "-c", "import torch, transfer_queue; assert torch.version.cuda is None, 'a CUDA torch was installed'"],
    ]
    for command in steps:
        logger.info("running %s", " ".join(command[2:]))
        completed = subprocess.run(command, stdout=sys.stderr, check=False)
        if completed.returncode != 0:
            raise TransferQueueArmError(f"{' '.join(command)} failed with exit status {completed.returncode}")
    stamp.write_text(wanted)
    return _venv_python(venv_dir)


def run_transferqueue_arms(
    config: WorkloadConfig,
    *,
    layouts: Sequence[str] = ("a", "b"),
    warmup_steps: int = 1,
    steps: int = 2,
    storage_units: int = 2,
    venv_dir: Path = DEFAULT_VENV,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """Run the TransferQueue arms on ``config``'s workload; returns the arm's JSON document.

    ``layouts``: ``a`` (as users use it), ``b`` (as the paper configured it), ``b-tp-shared`` (optional).
    The arm's progress goes to this process's stderr.
    """
    python = ensure_tq_venv(venv_dir)
    with tempfile.TemporaryDirectory(prefix="kt-tq-arm-") as scratch:
        output = Path(scratch) / "transferqueue.json"
        command = [
            str(python),
            str(ARM_SCRIPT),
            "--workload-json",
            json.dumps(config.to_dict()),
            "--layouts",
            ",".join(layouts),
            "--warmup-steps",
            str(warmup_steps),
            "--steps",
            str(steps),
            "--storage-units",
            str(storage_units),
            "--output",
            str(output),
        ]
        logger.info("running the TransferQueue arms (%s) in %s", ",".join(layouts), venv_dir)
        try:
            # The arm's stdout (Ray and library chatter) goes to stderr, so our stdout stays pure JSON.
            completed = subprocess.run(
                command, stdout=sys.stderr, timeout=timeout_s, check=False, env=_arm_environment()
            )
        except subprocess.TimeoutExpired as error:
            raise TransferQueueArmError(f"the TransferQueue arm ran past {timeout_s:.0f} s") from error
        if completed.returncode != 0 or not output.is_file():
            raise TransferQueueArmError(f"the TransferQueue arm failed with exit status {completed.returncode}")
        return json.loads(output.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--layouts", default="a,b", help="comma-separated: a, b, b-tp-shared (default a,b)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default 1 (0 with --smoke)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps; default 2 (1 with --smoke)")
    parser.add_argument("--storage-units", type=int, default=2)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    arguments = parser.parse_args(argv)
    config = config_from_arguments(arguments)
    default_warmup, default_steps = (0, 1) if arguments.smoke else (1, 2)
    result = run_transferqueue_arms(
        config,
        layouts=[name.strip() for name in arguments.layouts.split(",") if name.strip()],
        warmup_steps=default_warmup if arguments.warmup_steps is None else arguments.warmup_steps,
        steps=default_steps if arguments.steps is None else arguments.steps,
        storage_units=arguments.storage_units,
        venv_dir=arguments.venv,
    )
    document = json.dumps(result, indent=2)
    if arguments.output:
        arguments.output.parent.mkdir(parents=True, exist_ok=True)
        arguments.output.write_text(document + "\n")
    print(document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
