"""Tell the segment that an IP now lives behind a new MAC: gratuitous ARP and unsolicited NA.

The address just moved from the bond (its MAC) to the pod's macvlan (another MAC); switches and
peers would keep sending to the old MAC until their caches expire. The packets are sent from
sockets opened inside the pod netns (the only place the pod interface exists).
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from rdma_cni.net.netns import Netns, entered

ETH_P_ARP = 0x0806
IPPROTO_IPV6 = 41
IPV6_MULTICAST_IF = 17
IPV6_MULTICAST_HOPS = 18
ND_NEIGHBOR_ADVERT = 136
NA_FLAG_OVERRIDE = 0x20000000


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def gratuitous_arp_frame(mac: str, ip: str) -> bytes:
    """An ARP request for our own address (sender = target = ip), to broadcast."""
    src = _mac_bytes(mac)
    addr = socket.inet_aton(ip)
    eth = b"\xff" * 6 + src + struct.pack("!H", ETH_P_ARP)
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + src + addr + b"\x00" * 6 + addr
    return eth + arp


def unsolicited_na(mac: str, ip: str) -> bytes:
    """ICMPv6 NA with Override and the target link-layer option; the kernel fills the checksum."""
    target = ipaddress.IPv6Address(ip).packed
    option = struct.pack("!BB", 2, 1) + _mac_bytes(mac)
    return struct.pack("!BBHI", ND_NEIGHBOR_ADVERT, 0, 0, NA_FLAG_OVERRIDE) + target + option


def announce(ns: Netns, ifname: str, ifindex: int, mac: str, ips: list[str], repeat: int = 2) -> None:
    """Send ``repeat`` announcements per address (some switches drop the first after a MAC move)."""
    v4 = [ip for ip in ips if ":" not in ip]
    v6 = [ip for ip in ips if ":" in ip]
    with entered(ns):
        arp = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) if v4 else None
        icmp6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) if v6 else None
    try:
        if arp is not None:
            arp.bind((ifname, ETH_P_ARP))
            for ip in v4:
                for _ in range(repeat):
                    arp.send(gratuitous_arp_frame(mac, ip))
        if icmp6 is not None:
            icmp6.setsockopt(IPPROTO_IPV6, IPV6_MULTICAST_HOPS, 255)
            icmp6.setsockopt(IPPROTO_IPV6, IPV6_MULTICAST_IF, ifindex)
            icmp6.bind((v6[0], 0, 0, ifindex))  # source: the pod has no link-local (addrgen off)
            for ip in v6:
                for _ in range(repeat):
                    icmp6.sendto(unsolicited_na(mac, ip), ("ff02::1", 0, 0, ifindex))
    finally:
        for sock in (arp, icmp6):
            if sock is not None:
                sock.close()
