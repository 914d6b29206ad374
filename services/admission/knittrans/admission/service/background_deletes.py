"""A file store's released units, deleted by a helper process at the lowest CPU priority.

Deleting a unit of the file store frees its memory on /dev/shm: kernel work, the size of the unit, in the process
that unlinks the file (about 24 ms of one core per 181 MB). A mini-batch's units are released when its last
consumer reports its optimizer step, the moment the trainer ranks on the node take the next mini-batch's first
micro-batches (and, in a cold step, when the sidecars read the next mini-batch). The admission service cannot make
a thread of its own yield to them: niceness ranks threads only within a session (knittrans.serving.priority). So a
helper in a session of its own, at niceness 19, unlinks the files, on cores nobody else wants.

The helper starts with the service and answers one request at a time over its stdin and stdout: a JSON list of
keys in, ``{"removed": n}`` or ``{"error": "..."}`` out. It exits when its input ends, so it never outlives the
service: the service closes the pipe when it stops, and the kernel closes it when the service dies, even by
kill -9. A helper that died or stopped answering is started again and the batch reported ``Unavailable``; the
deleter retries it.
"""

from __future__ import annotations

import argparse
import json
import logging
import select
import subprocess
import sys
import threading
from collections.abc import Sequence

from knittrans.errors import KnitTransError, Unavailable
from knittrans.serving.priority import MAX_NICE, lower_cpu_priority
from knittrans.store.factory import open_store

logger = logging.getLogger(__name__)

ANSWER_SECONDS = 60.0  # a batch the helper has not answered by then: it is stuck, start another


class HelperDeletes:
    """``delete(keys)``: delete the units through the helper; blocking (the deleter calls it on a worker thread)."""

    def __init__(self, store_url: str, job: str, *, answer_seconds: float = ANSWER_SECONDS) -> None:
        self._command = [sys.executable, "-m", __name__, "--store", store_url, "--job", job]
        self._answer_seconds = answer_seconds
        self._lock = threading.Lock()
        self._process = self._start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _start(self) -> subprocess.Popen[bytes]:
        # Its own session: its scheduling group is its own to lower (the service's stays as it is).
        return subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def delete(self, keys: list[str]) -> None:
        with self._lock:
            process = self._process
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(json.dumps(keys).encode() + b"\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], self._answer_seconds)
                line = process.stdout.readline() if ready else b""
            except (OSError, ValueError) as error:  # its pipe broke: it died
                line, failure = b"", str(error)
            else:
                failure = "it exited" if ready else f"no answer in {self._answer_seconds:g}s"
            if not line:
                self._replace()
                raise Unavailable(f"the deletion helper failed ({failure}); started another", field="store")
        reply = json.loads(line)
        if "error" in reply:
            raise Unavailable(f"deleting released units failed: {reply['error']}", field="store")

    def _replace(self) -> None:
        self._stop(self._process)
        self._process = self._start()

    def close(self) -> None:
        with self._lock:
            self._stop(self._process)

    @staticmethod
    def _stop(process: subprocess.Popen[bytes]) -> None:
        if process.stdin is not None:
            try:
                process.stdin.close()  # end of input: it exits
            except OSError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lower_cpu_priority(MAX_NICE)
    store = open_store(args.store, job=args.job)
    try:
        for line in sys.stdin.buffer:
            keys = json.loads(line)
            try:
                reply: dict[str, object] = {"removed": store.delete_many(keys)}
                store.wait_removed(keys)
            except KnitTransError as error:
                reply = {"error": str(error)}
            sys.stdout.buffer.write(json.dumps(reply).encode() + b"\n")
            sys.stdout.buffer.flush()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
