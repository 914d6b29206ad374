"""Process environment that Ray and TransferQueue read when they are imported, so it is set before that.

- ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray use the loopback address as the node address. Ray reads it
  into a module constant on import; Ray's agents, TransferQueue's ZMQ sockets (bound to Ray's node address)
  and the actors' processes (which inherit this process's environment) then stay on 127.0.0.1.
- ``TQ_LOGGING_LEVEL`` is read by every TransferQueue logger when its module is imported.

No module under ``tq`` other than this one may be imported before :func:`prepare_process_environment` runs.
"""

from __future__ import annotations

import os
import sys


def prepare_process_environment(*, tq_log_level: str) -> None:
    if "ray" in sys.modules or "transfer_queue" in sys.modules:
        raise RuntimeError("Ray or TransferQueue was imported before the process environment was prepared")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["TQ_LOGGING_LEVEL"] = tq_log_level
