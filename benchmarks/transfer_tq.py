"""Launcher of the TransferQueue arms of ``benchmarks/transfer.py``, from the main venv.

TransferQueue 0.1.11 runs in a venv of its own, ``bench-out/tq-venv`` (its wheel installs a top-level ``tests``
package that would shadow ours). :class:`TransferQueueSession` creates that venv when missing, starts
``transferqueue_arm.py`` in it with the same :class:`~transfer_workload.WorkloadConfig`, and runs the arms it is
asked for, each returned as a dict. Nothing here imports TransferQueue.

    python benchmarks/transfer_tq.py --smoke --arms b,streaming   # fast; JSON on stdout, progress on stderr
    python benchmarks/transfer_tq.py                  # the issue's full-size step
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import subprocess
import sys
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


class TransferQueueSession:
    """The TransferQueue arm process, started once (Ray, TransferQueue, the readers, the streaming loaders) and
    kept for the whole run; :meth:`run` runs one arm in it. Commands go to its stdin, replies come back on a
    pipe of their own (its stdout, with Ray's chatter, goes to our stderr)."""

    def __init__(self, config: WorkloadConfig, *, storage_units: int = 2, venv_dir: Path = DEFAULT_VENV,
                 timeout_s: float = 3600.0) -> None:
        python = ensure_tq_venv(venv_dir)
        self._timeout_s = timeout_s
        read_end, write_end = os.pipe()
        command = [str(python), str(ARM_SCRIPT), "--workload-json", json.dumps(config.to_dict()),
                   "--storage-units", str(storage_units), "--reply-fd", str(write_end)]
        logger.info("starting the TransferQueue arm process in %s", venv_dir)
        try:
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=sys.stderr, text=True,
                                             pass_fds=(write_end,), env=_arm_environment())
        finally:
            os.close(write_end)
        self._replies = os.fdopen(read_end, "r")
        self.description: dict[str, Any] = self._reply()

    def _reply(self) -> dict[str, Any]:
        ready, _, _ = select.select([self._replies], [], [], self._timeout_s)
        line = self._replies.readline() if ready else ""
        if not line:
            code = self._process.poll()
            raise TransferQueueArmError(f"the TransferQueue arm process gave no answer (exit status {code})")
        return dict(json.loads(line))

    def run(self, arm: str, *, warmup_steps: int, steps: int) -> dict[str, Any]:
        """``arm``: a layout (``a``, ``b``, ``b-tp-shared``) or ``streaming``; returns the arm's JSON record."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"arm": arm, "warmup_steps": warmup_steps, "steps": steps}) + "\n")
        self._process.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()  # end of input ends the session
        try:
            self._process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._replies.close()


def run_transferqueue_arms(config: WorkloadConfig, *, arms: Sequence[str] = ("a", "b"), warmup_steps: int = 1,
                           steps: int = 2, storage_units: int = 2, venv_dir: Path = DEFAULT_VENV) -> dict[str, Any]:
    """Run the TransferQueue arms once each; returns the session's description with the arms' records."""
    session = TransferQueueSession(config, storage_units=storage_units, venv_dir=venv_dir)
    try:
        return {**session.description,
                "arms": [session.run(arm, warmup_steps=warmup_steps, steps=steps) for arm in arms]}
    finally:
        session.close()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(parser)
    parser.add_argument("--arms", default="a,b", help="comma-separated: a, b, b-tp-shared, streaming (default a,b)")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="measured steps; default 2 (1 with --smoke)")
    parser.add_argument("--storage-units", type=int, default=2)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    arguments = parser.parse_args(argv)
    config = config_from_arguments(arguments)
    result = run_transferqueue_arms(
        config,
        arms=[name.strip() for name in arguments.arms.split(",") if name.strip()],
        warmup_steps=arguments.warmup_steps,
        steps=(1 if arguments.smoke else 2) if arguments.steps is None else arguments.steps,
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
