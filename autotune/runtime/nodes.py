"""Several nodes: how many this job spans, and the network interface a node's ranks use.

Stdlib only, and runnable as a script: launch.sh and torchrun.sh run
``python tuned_runtime/nodes.py HOST PORT [IFACE]`` before torchrun starts, to choose the
interface (``GLOO_SOCKET_IFNAME``) and the address the node announces (``--local-addr``).
It prints ``IFACE ADDRESS LOCAL``, LOCAL being 1 when HOST is an address of this machine,
or exits 2 saying why no interface could be chosen.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys

SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's (primary) IPv4 address


def count() -> int:
    """The nodes of this job: WORLD_SIZE // LOCAL_WORLD_SIZE as the launcher set them (torchrun
    does); 1 when either is unset or the ranks are not spread evenly, as a job of ranks the
    script started itself, or a scheduler's ranks without a local world size."""
    try:
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 1
    if local < 1 or world < local or world % local:
        return 1
    return world // local


def _ipv4_of(name: str) -> str | None:
    """The primary IPv4 address of interface ``name``; None when it has none."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_addresses() -> dict[str, list[str]]:
    """IPv6 addresses by interface, from /proc/net/if_inet6 (empty without IPv6)."""
    found: dict[str, list[str]] = {}
    try:
        with open("/proc/net/if_inet6") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) == 6:
            address = str(ipaddress.IPv6Address(int(fields[0], 16)))
            found.setdefault(fields[5], []).append(address)
    return found


def interface_addresses() -> dict[str, list[str]]:
    """Every interface of this machine with its addresses (IPv4 first). Secondary IPv4
    addresses are found through psutil where it is installed; the stdlib sees an
    interface's primary one only."""
    names = [name for _, name in socket.if_nameindex()]
    found: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        v4 = _ipv4_of(name)
        if v4:
            found[name].append(v4)
    for name, addresses in _ipv6_addresses().items():
        found.setdefault(name, []).extend(addresses)
    try:
        import psutil
    except ImportError:
        return found
    for name, entries in psutil.net_if_addrs().items():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                address = entry.address.split("%")[0]
                if address not in found.setdefault(name, []):
                    found[name].append(address)
    return found


def _unbracketed(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def source_address(host: str, port: int) -> str:
    """The address of this machine that traffic to ``host`` leaves from: the kernel's
    routing decision, read from a UDP socket connected there (nothing is sent)."""
    infos = socket.getaddrinfo(_unbracketed(host), port, type=socket.SOCK_DGRAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as gloo prefers it
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(address)
            except OSError as e:
                error = e
                continue
            return str(s.getsockname()[0]).split("%")[0]
    raise OSError(f"no route to {host}: {error}")


def choose(host: str, port: int, iface: str | None) -> tuple[str, str, bool]:
    """(interface, its address, whether ``host`` is this machine) for a node whose job meets
    at ``host``: ``iface`` when given, else the interface through which ``host`` is
    reached. ValueError says why none can be chosen."""
    addresses = interface_addresses()
    try:
        source = source_address(host, port)
    except OSError as e:
        if iface is None:
            raise ValueError(f"cannot reach the rendezvous host {host} ({e}): check the name, "
                             "or name the interface with --iface") from e
        source = None
    if iface is None:
        if source is not None and ipaddress.ip_address(source).is_loopback and not _loopback_literal(host):
            # Debian's /etc/hosts names the machine itself 127.0.1.1: on the node that hosts
            # the rendezvous its own name routes through loopback, where no other node reaches.
            raise ValueError(f"{host} resolves to a loopback address on this machine (an /etc/hosts line "
                             "such as Debian's 127.0.1.1 for the machine's own name), which the other nodes "
                             "cannot reach: name the interface the nodes share with --iface "
                             f"({', '.join(sorted(addresses))})")
        iface = next((name for name, found in addresses.items() if source in found), None)
        if iface is None:
            raise ValueError(f"no interface of this machine holds {source}, the address traffic to "
                             f"{host} leaves from: name one with --iface ({', '.join(sorted(addresses))})")
    if iface not in addresses:
        raise ValueError(f"--iface {iface}: no such interface here ({', '.join(sorted(addresses))})")
    usable = [a for a in addresses[iface] if not ipaddress.ip_address(a).is_link_local]
    if not usable:
        raise ValueError(f"--iface {iface}: the interface has no address")
    address = source if source in usable else usable[0]
    return iface, address, _resolves_to_self(host, addresses)


def _loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(_unbracketed(host)).is_loopback
    except ValueError:
        return False


def _resolves_to_self(host: str, addresses: dict[str, list[str]]) -> bool:
    """Whether ``host`` names one of this machine's addresses."""
    mine = {a for found in addresses.values() for a in found}
    try:
        resolved = {str(info[4][0]).split("%")[0]
                    for info in socket.getaddrinfo(_unbracketed(host), None)}
    except OSError:
        return False
    return any(ipaddress.ip_address(a).is_loopback or a in mine for a in resolved)


def main(argv: list[str]) -> int:
    """``HOST PORT [IFACE]``: print ``IFACE ADDRESS LOCAL`` (see the module's note)."""
    if len(argv) not in (2, 3) or not argv[1].isdigit():
        print("usage: nodes.py HOST PORT [IFACE]", file=sys.stderr)
        return 2
    try:
        iface, address, local = choose(argv[0], int(argv[1]), argv[2] if len(argv) == 3 and argv[2] else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(iface, address, int(local))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
