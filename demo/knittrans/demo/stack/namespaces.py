"""Separate network hosts on one machine: Linux network namespaces joined by a bridge, for the multi-node demo, test
and benchmark (root only).

Layout of a cluster tagged ``T`` (the tag keeps parallel runs apart; it defaults to this process id):

* ``kt-T-br``: a namespace holding only the bridge ``br0``;
* ``kt-T-n0`` .. ``kt-T-n<N-1>``: one namespace per node, with ``eth0`` (one end of a veth pair whose other end is
  a port of the bridge) at ``<subnet>.<i+1>/24`` and ``lo`` up. No route leaves the subnet, and no address of it
  exists outside these namespaces, so traffic never leaves them;
* per node, a private mount namespace with its own tmpfs on ``/dev/shm``: network namespaces alone share
  ``/dev/shm`` (and ``/tmp``), so a ``file://`` store or a shared-memory segment written on one "node" would be
  visible on another. ``/tmp`` stays shared: logs, ready files and the demo's output directory live there.

Every process of a node runs through :meth:`Node.command` (``nsenter`` into the net and mount namespaces of the
node's holder process, a ``sleep`` that keeps the mount namespace alive). :meth:`NamespaceCluster.stop` kills
what still runs in the node namespaces, then the holders, then deletes every namespace: nothing is left behind.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from knittrans.errors import FailedPrecondition, InvalidArgument
from knittrans.launch.interruptions import stop_deferred

logger = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
DEFAULT_SUBNET = "10.201.0"  # a /24 private to the cluster's namespaces
_TAG = re.compile(r"^[a-z0-9]{1,8}$")


def namespaces_unavailable() -> str:
    """Why network namespaces cannot be built here, or "" when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (uid 0)"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"kt-probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        mounted = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
            capture_output=True, text=True,
        )
        if mounted.returncode != 0:
            return f"cannot mount a private /dev/shm in a namespace: {mounted.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


@dataclass(frozen=True, kw_only=True)
class Node:
    index: int
    netns: str
    address: str
    holder_pid: int

    @property
    def name(self) -> str:
        return f"node{self.index}"

    def enter(self) -> list[str]:
        """The prefix that runs a command on this node (its network and its /dev/shm)."""
        return ["nsenter", f"--target={self.holder_pid}", "--net", "--mount", "--"]

    def command(self, argv: Sequence[str]) -> list[str]:
        return [*self.enter(), *argv]

    def run(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)  # type: ignore[call-overload]


@dataclass
class NamespaceCluster:
    """``nodes`` network hosts on a private subnet; a context manager that always tears down."""

    nodes_wanted: int = 3
    subnet: str = DEFAULT_SUBNET
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10**8}")
    nodes: list[Node] = field(default_factory=list)
    _holders: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _created: list[str] = field(default_factory=list, repr=False)
    _inodes: set[int] = field(default_factory=set, repr=False)  # kept after stop: what to look for in /proc

    def __post_init__(self) -> None:
        if not 1 <= self.nodes_wanted <= 200:
            raise InvalidArgument("must be in [1, 200]", field="nodes")
        if not _TAG.match(self.tag):
            raise InvalidArgument("must be 1 to 8 lowercase letters or digits", field="tag")

    @property
    def bridge_netns(self) -> str:
        return f"kt-{self.tag}-br"

    def netns_names(self) -> list[str]:
        return [self.bridge_netns, *(f"kt-{self.tag}-n{i}" for i in range(self.nodes_wanted))]

    def start(self) -> NamespaceCluster:
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        self._ip("netns", "add", name)
        self._created.append(name)
        self._inodes.add((NETNS_DIR / name).stat().st_ino)

    def _ip(self, *args: str) -> None:
        result = subprocess.run(["ip", *args], capture_output=True, text=True)
        if result.returncode != 0:
            raise FailedPrecondition(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")

    def _build(self) -> None:
        bridge = self.bridge_netns
        self._add_netns(bridge)
        self._ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        self._ip("-n", bridge, "link", "set", "br0", "up")
        for index in range(self.nodes_wanted):
            netns = f"kt-{self.tag}-n{index}"
            address = f"{self.subnet}.{index + 1}"
            self._add_netns(netns)
            # The pair is made inside the bridge namespace, so no interface name is ever global.
            self._ip("-n", bridge, "link", "add", f"veth{index}", "type", "veth", "peer", "name", "eth0", "netns",
                     netns)
            self._ip("-n", bridge, "link", "set", f"veth{index}", "master", "br0", "up")
            self._ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            self._ip("-n", netns, "link", "set", "eth0", "up")
            self._ip("-n", netns, "link", "set", "lo", "up")
            with stop_deferred():  # recorded before a stop can come, so that the teardown reaches it
                holder = subprocess.Popen(
                    ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                     "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec sleep infinity"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                self._holders.append(holder)
            self._wait_for_holder(holder, netns)
            self.nodes.append(Node(index=index, netns=netns, address=address, holder_pid=holder.pid))
        logger.info("namespace cluster %s: %s", self.tag, ", ".join(f"{n.name}={n.address}" for n in self.nodes))

    @staticmethod
    def _wait_for_holder(holder: subprocess.Popen, netns: str, timeout: float = 10.0) -> None:
        """The holder is ready once it is ``sleep`` (after the mount): ``ip``, ``unshare`` and ``sh`` exec into it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if holder.poll() is not None:
                error = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
                raise FailedPrecondition(f"the holder of {netns} exited with {holder.returncode}: {error.strip()}")
            try:
                if Path(f"/proc/{holder.pid}/cmdline").read_bytes().startswith(b"sleep"):
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise FailedPrecondition(f"the holder of {netns} did not start in {timeout:.0f}s")

    def pids_inside(self) -> list[int]:
        """Every process whose network namespace is (or was) one of this cluster's."""
        inodes = self._inodes
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "ns" / "net").stat().st_ino in inodes:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self) -> None:
        """Kill everything in the namespaces (holders included), then delete the namespaces. Idempotent."""
        for _ in range(3):
            pids = self.pids_inside()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while self.pids_inside() and time.monotonic() < deadline:
                time.sleep(0.02)
        for holder in self._holders:
            try:
                holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
        self._holders.clear()
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._created.clear()
        self.nodes.clear()

    def __enter__(self) -> NamespaceCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def leftovers(tag: str) -> dict[str, list[str]]:
    """What a cluster tagged ``tag`` left behind: its namespaces and their mounts under /run/netns."""
    prefix = f"kt-{tag}-"
    names = sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.exists() else []
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f"/{prefix}" in line]
    return {"namespaces": names, "mounts": mounts}
