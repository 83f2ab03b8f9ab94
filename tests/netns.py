"""Several "hosts" on this machine: Linux network namespaces joined by veth pairs to a bridge
(tests/test_multihost.py).

Each host is a network namespace with one interface, ``eth0``, holding its own
address on a private /24 (``10.77.0.x`` by default) and its loopback. The other
end of each host's veth pair is plugged into a bridge that lives in a namespace
of its own (the "switch"), so nothing is added to this machine's own network:
deleting the namespaces removes every interface. Processes started on a host
(``ip netns exec NS python ...``) see only that host's interfaces, so a
connection from one host to another crosses two veth pairs and the bridge,
counted in each interface's byte statistics. The hosts still share the kernel,
the pid space and the file system: that is all a namespace separates.

A Docker engine on the same machine sets the host's iptables ``FORWARD`` policy to ``DROP`` (and loads
``br_netfilter``, which sends bridged frames through iptables). That does not reach these hosts: the
bridge is in the switch's namespace, whose packet filter is its own and empty, so these tests pass with
an engine running (``make test-containers`` starts one) as without.

Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's
``ip``; ``unavailable()`` says why they cannot be created, by trying to.

Example::

    >>> with Network("10.77.0") as net:
    ...     a, b = net.add_host("a", 2), net.add_host("b", 3)
    ...     proc = net.spawn(procs, a, "-m", "http.server", "--bind", a.address)
    ...     net.interface_bytes(b)   # {"rx": ..., "tx": ...}
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from typing import Optional

from tests.processes import Proc, Processes

#: Every ``ip`` command is local and quick; this bounds one that hangs (a wedged kernel or lock).
IP_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable() -> Optional[str]:
    """Why network namespaces cannot be created here (for ``pytest.skip``), or None when they can:
    tried for real, by creating and deleting one."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's; this is {sys.platform}"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (Debian: apt-get install iproute2)"
    name = f"dsprobe-{uuid.uuid4().hex[:8]}"
    try:
        result = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns add` could not run: {exc}"
    if result.returncode != 0:
        who = "" if os.geteuid() == 0 else f" (this runs as uid {os.geteuid()}, not root)"
        return f"cannot create a network namespace{who}: `ip netns add` said: {result.stderr.strip()}"
    try:
        veth = _ip("-n", name, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb", check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair in a network namespace: {veth.stderr.strip()}"
        run = _ip("netns", "exec", name, "true", check=False)
        if run.returncode != 0:
            return f"cannot run a command in a network namespace (`ip netns exec`): {run.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


@dataclasses.dataclass
class Host:
    """One simulated host: its namespace and its address on the network."""

    name: str
    namespace: str
    address: str


class Network:
    """Hosts on one bridged /24; ``close`` (or leaving the ``with``) kills what still runs in them
    and deletes every namespace, whatever failed before."""

    def __init__(self, subnet: str = "10.77.0"):
        self.subnet = subnet
        # Unique per run: two runs at once (or one left over by a killed run) do not collide.
        self.tag = f"ds{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}-switch"
        self.hosts: list[Host] = []
        self._namespaces: list[str] = []
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()  # nothing left behind by a half-built network
            raise

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add_host(self, name: str, last_octet: int) -> Host:
        """A namespace ``<tag>-<name>`` whose ``eth0`` has ``<subnet>.<last_octet>/24``, plugged into the bridge."""
        namespace = f"{self.tag}-{name}"
        self._add_namespace(namespace)
        port = f"p{len(self.hosts)}"  # the switch's end (a name of the switch's namespace)
        _ip("-n", self.switch, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        address = f"{self.subnet}.{last_octet}"
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        host = Host(name, namespace, address)
        self.hosts.append(host)
        return host

    def spawn(self, procs: Processes, host: Host, *args: str, name: str = "proc") -> Proc:
        """``ip netns exec <host> python args...``, tracked (and killed at the end) by ``procs``. ``ip netns
        exec`` execs the command, so the process's pid is Python's."""
        path = procs.tmp_dir / f"{len(procs.procs):02d}-{host.name}-{name}.stderr"
        proc = Proc(["ip", "netns", "exec", host.namespace, sys.executable, *args], procs.env, path)
        procs.procs.append(proc)
        return proc

    @staticmethod
    def pids(host: Host) -> set[int]:
        """Every process running in the host's namespace."""
        out = _ip("netns", "pids", host.namespace).stdout
        return {int(p) for p in out.split()}

    @staticmethod
    def interface_bytes(host: Host) -> dict[str, int]:
        """Bytes received and sent by the host's ``eth0`` so far (the kernel's counters)."""
        link = json.loads(_ip("-j", "-s", "-n", host.namespace, "link", "show", "dev", "eth0").stdout)[0]
        return {"rx": link["stats64"]["rx"]["bytes"], "tx": link["stats64"]["tx"]["bytes"]}

    def close(self) -> None:
        """Kills every process left in the hosts (all started by this test) and deletes the namespaces."""
        errors = []
        for host in self.hosts:
            try:
                for pid in self.pids(host):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                errors.append(f"{host.namespace}: {exc}")
        for namespace in reversed(self._namespaces):
            try:
                # Deleting a namespace destroys its interfaces (and the veth peers outside it).
                _ip("netns", "del", namespace)
            except (RuntimeError, subprocess.SubprocessError) as exc:
                errors.append(str(exc))
        self._namespaces.clear()
        if errors:
            raise RuntimeError("cleaning up the network namespaces: " + "; ".join(errors))

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
