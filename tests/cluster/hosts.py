"""Hosts of a cluster on one machine: one Linux network namespace per host, each joined
to a bridge by a veth pair and given its own address in a private /24 that exists only
inside this machine. The bridge's own address is the operator's console (the process that
lays the cluster out reads the ledger from there).

Names and the subnet are chosen per cluster, so two side by side never collide; whatever
a cluster made is removed when it is closed, when its owner exits, and, should the owner
be killed outright, by the next cluster made on the machine (it sweeps what a dead owner
left). Needs root and iproute2 (`ip netns`, `ip link`).

Used by tests/cluster/ and bench/cluster.py; the run laid out on these hosts is
tests/cluster/deployment.py.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

OWNERS = Path("/run/streamrl-cluster")  # one file per live cluster: its tag, holding its owner's pid
PREFIX = "srl"  # every name a cluster makes starts with it (namespaces srl<tag>-<host>)


def unavailable() -> str | None:
    """Why hosts cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    name: str  # its role in the cluster: broker, ledger, learner-1, ...
    netns: str
    address: str
    link: str  # the bridge's end of its veth pair: down cuts the host off the network


class Hosts:
    """The cluster's hosts; a context manager that removes them all."""

    def __init__(self, names: list[str]):
        self.tag = secrets.token_hex(3)
        self.bridge = f"{PREFIX}b{self.tag}"
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.console = str(addresses[0])  # the bridge's address, in this process's namespace
        self.hosts = {
            name: Host(name, f"{PREFIX}{self.tag}-{name}", str(addresses[10 + i]), f"{PREFIX}{self.tag}v{i}")
            for i, name in enumerate(names)
        }
        self._made: list[tuple[str, str]] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Hosts:
        sweep_dead_owners()
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.tag).write_text(f"{os.getpid()}\n")
        atexit.register(self.close)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        ip("addr", "add", f"{self.console}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts.values()):
            ip("netns", "add", host.netns)
            self._made.append(("netns", host.netns))
            peer = f"{PREFIX}{self.tag}p{i}"
            ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
            self._made.append(("link", host.link))
            ip("link", "set", peer, "netns", host.netns)
            ip("link", "set", host.link, "master", self.bridge)
            ip("link", "set", host.link, "up")
            ip("-n", host.netns, "link", "set", peer, "name", "eth0")
            ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", host.netns, "link", "set", "eth0", "up")
            # a host reaches its own address through loopback, as on any machine
            ip("-n", host.netns, "link", "set", "lo", "up")

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` as run on host `name`."""
        return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

    def cut(self, name: str) -> None:
        """The host's link down: it is off the network (its processes keep running)."""
        ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        ip("link", "set", self.hosts[name].link, "up")

    def pids(self, name: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def kill(self, name: str) -> int:
        """SIGKILL every process of the host; how many there were."""
        pids = self.pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def close(self) -> None:
        for name in self.hosts:
            with contextlib.suppress(RuntimeError, FileNotFoundError):
                self.kill(name)
        for kind, name in reversed(self._made):
            with contextlib.suppress(RuntimeError):
                ip(kind, "del", name)
        self._made.clear()
        with contextlib.suppress(FileNotFoundError):
            (OWNERS / self.tag).unlink()


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that no address or route of this machine overlaps, chosen
    under a lock so that two clusters made at once take different ones."""
    OWNERS.mkdir(parents=True, exist_ok=True)
    with open(OWNERS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = [
            ipaddress.ip_network(word, strict=False)
            for word in ip("-4", "route", "show", "table", "all").split()
            if _is_network(word)
        ]
        for _ in range(200):
            subnet = ipaddress.ip_network(f"10.{random.randrange(64, 255)}.{random.randrange(256)}.0/24")
            if not any(subnet.overlaps(other) for other in taken):
                return subnet
    raise RuntimeError("no free 10.x.y.0/24 on this machine")


def _is_network(word: str) -> bool:
    try:
        ipaddress.ip_network(word, strict=False)
    except ValueError:
        return False
    return "." in word


def sweep_dead_owners() -> None:
    """Remove what clusters whose owner died left behind."""
    if not OWNERS.exists():
        return
    for owner in OWNERS.iterdir():
        if owner.name.startswith("."):
            continue
        try:
            os.kill(int(owner.read_text().split()[0]), 0)
            continue  # alive
        except (ProcessLookupError, ValueError, IndexError):
            pass
        prefix = f"{PREFIX}{owner.name}"
        for netns in ip("netns", "list").split():
            if netns.startswith(prefix + "-"):
                for pid in subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(RuntimeError):
                    ip("netns", "del", netns)
        with contextlib.suppress(RuntimeError):
            ip("link", "del", f"{PREFIX}b{owner.name}")
        owner.unlink(missing_ok=True)
