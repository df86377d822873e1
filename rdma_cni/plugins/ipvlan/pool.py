"""Which address of a bond's subnet a pod gets: a pure function of the subnet, what is reserved,
the config's ``ranges`` and ``exclude``, and what other pods hold.

Never handed out: the bond's own addresses, the gateways of the bond's routes, the network
address (and for IPv4 the broadcast address, on a prefix shorter than /31), anything in
``exclude``, anything outside the bond's ``ranges`` of that family when given, anything held.
The lowest free address wins, so the choice is the same on every replay of the same state.

    subnet = Subnet("bond0", ip_network("198.51.100.0/28"), frozenset({ip_address("198.51.100.2")}))
    choose(subnet, ranges=[], exclude=[parse_span("198.51.100.9")], held={ip_address("198.51.100.3")})
    -> IPv4Address('198.51.100.1')

What is held is not stored here: it is derived from the write-ahead records of the attachments
(:class:`rdma_cni.state.NodeState`), exactly as rdma-macvlan's pins are, so it cannot disagree
with what DEL will free.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Span:
    """An inclusive run of addresses of one family (``a-b``, a CIDR, or one address)."""

    first: int
    last: int
    version: int

    def describe(self) -> str:
        a, b = _ip(self.first, self.version), _ip(self.last, self.version)
        return str(a) if a == b else f"{a}-{b}"


def _ip(value: int, version: int) -> IPAddress:
    return ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)


def parse_span(text: str) -> Span:
    """``198.51.100.4-198.51.100.14`` (inclusive), ``198.51.100.12/30`` or ``198.51.100.9``;
    ValueError saying what is wrong."""
    if "-" in text:
        a_text, _, b_text = text.partition("-")
        a, b = ipaddress.ip_address(a_text.strip()), ipaddress.ip_address(b_text.strip())
        if a.version != b.version:
            raise ValueError(f"{text!r} mixes IPv4 and IPv6")
        if int(a) > int(b):
            raise ValueError(f"{text!r} ends before it starts")
        return Span(int(a), int(b), a.version)
    if "/" in text:
        net = ipaddress.ip_network(text.strip(), strict=False)
        return Span(int(net.network_address), int(net.broadcast_address), net.version)
    ip = ipaddress.ip_address(text.strip())
    return Span(int(ip), int(ip), ip.version)


@dataclass(frozen=True)
class Subnet:
    """One bond's subnet of one family and what on it is never handed out (its own addresses,
    its routes' gateways)."""

    bond: str
    network: IPNetwork
    reserved: frozenset[IPAddress] = frozenset()


def host_span(network: IPNetwork) -> Span | None:
    """The addresses of ``network`` a host may hold: not the network address (the IPv6
    subnet-router anycast), not the IPv4 broadcast; /31 and /32 (/127, /128) as they are."""
    first, last = int(network.network_address), int(network.broadcast_address)
    if network.version == 4 and network.prefixlen < 31:
        first, last = first + 1, last - 1
    elif network.version == 6 and network.prefixlen < 127:
        first += 1
    return Span(first, last, network.version) if first <= last else None


def outside(subnet: Subnet, spans: Iterable[Span]) -> list[Span]:
    """The ``ranges`` spans of the subnet's family that are not inside it (a config error)."""
    net = subnet.network
    lo, hi = int(net.network_address), int(net.broadcast_address)
    return [s for s in spans if s.version == net.version and not (lo <= s.first and s.last <= hi)]


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(windows: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in windows:
        start = a
        for h0, h1 in holes:
            if h1 < start or h0 > b:
                continue
            if h0 > start:
                out.append((start, h0 - 1))
            start = max(start, h1 + 1)
        if start <= b:
            out.append((start, b))
    return out


def candidates(subnet: Subnet, ranges: Sequence[Span], exclude: Sequence[Span]) -> list[tuple[int, int]]:
    """The subnet's addresses a pod may get, before what is held: disjoint inclusive runs, in order."""
    net = subnet.network
    hosts = host_span(net)
    if hosts is None:
        return []
    mine = [s for s in ranges if s.version == net.version]
    windows = (
        [(max(s.first, hosts.first), min(s.last, hosts.last)) for s in mine]
        if mine
        else [(hosts.first, hosts.last)]
    )
    windows = _merge(w for w in windows if w[0] <= w[1])
    holes = _merge((s.first, s.last) for s in exclude if s.version == net.version)
    holes = _merge([*holes, *((int(ip), int(ip)) for ip in subnet.reserved if ip.version == net.version)])
    return _subtract(windows, holes)


def _free(runs: list[tuple[int, int]], taken: set[int]) -> Iterator[int]:
    for a, b in runs:
        value = a
        while value <= b:
            if value not in taken:
                yield value
            value += 1


def choose(
    subnet: Subnet, ranges: Sequence[Span], exclude: Sequence[Span], held: Collection[IPAddress]
) -> IPAddress | None:
    """The lowest address a new pod may get on this subnet, or None when none is left."""
    taken = {int(ip) for ip in held if ip.version == subnet.network.version}
    for value in _free(candidates(subnet, ranges, exclude), taken):
        return _ip(value, subnet.network.version)
    return None


def free_count(
    subnet: Subnet, ranges: Sequence[Span], exclude: Sequence[Span], held: Collection[IPAddress]
) -> int:
    """How many more pods this subnet can take (for ``cni-tool state``, doctor and metrics)."""
    runs = candidates(subnet, ranges, exclude)
    size = sum(b - a + 1 for a, b in runs)
    inside = sum(
        1
        for ip in set(held)
        if ip.version == subnet.network.version and any(a <= int(ip) <= b for a, b in runs)
    )
    return size - inside
