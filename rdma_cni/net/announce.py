"""Tell the segment that an IP now lives behind a new MAC: gratuitous ARP and unsolicited NA.

The address just moved from the bond (its MAC) to the pod's macvlan (another MAC); switches and
peers would keep sending to the old MAC until their caches expire.

IPv4: the kernel announces for us. ``arp_notify=1`` on the pod interface, set before it goes up,
makes the kernel broadcast a gratuitous ARP for every IPv4 address of the link at link-up
(``inetdev_event`` NETDEV_UP). Sending our own frames needs an AF_PACKET socket, and creating,
binding and closing one waits for an RCU grace period each time (``synchronize_net`` in
``packet_release``): ~25 ms per ADD, half of the whole call.

IPv6: unsolicited NAs (Override set) from a raw ICMPv6 socket opened inside the pod netns — cheap,
and independent of how the kernel treats NODAD addresses at link-up.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from rdma_cni.net.netns import Netns, entered

IPPROTO_IPV6 = 41
IPV6_MULTICAST_IF = 17
IPV6_MULTICAST_HOPS = 18
ND_NEIGHBOR_ADVERT = 136
NA_FLAG_OVERRIDE = 0x20000000


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def arm_arp_notify(ns: Netns, ifname: str) -> None:
    """``net.ipv4.conf.<ifname>.arp_notify = 1`` inside ``ns``; call while the link is still down.

    /proc/sys/net shows the netns of the opening *thread*, so the file is opened while this thread
    is inside the pod netns (the interface exists only there).
    """
    with entered(ns):
        fd = os.open(f"/proc/sys/net/ipv4/conf/{ifname}/arp_notify", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"1\n")
    finally:
        os.close(fd)


def unsolicited_na(mac: str, ip: str) -> bytes:
    """ICMPv6 NA with Override and the target link-layer option; the kernel fills the checksum."""
    target = ipaddress.IPv6Address(ip).packed
    option = struct.pack("!BB", 2, 1) + _mac_bytes(mac)
    return struct.pack("!BBHI", ND_NEIGHBOR_ADVERT, 0, 0, NA_FLAG_OVERRIDE) + target + option


def announce_ipv6(ns: Netns, ifindex: int, mac: str, ips: list[str], repeat: int = 2) -> None:
    """Send ``repeat`` unsolicited NAs per IPv6 address (some switches drop the first after a MAC move)."""
    v6 = [ip for ip in ips if ":" in ip]
    if not v6:
        return
    with entered(ns):
        icmp6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    try:
        icmp6.setsockopt(IPPROTO_IPV6, IPV6_MULTICAST_HOPS, 255)
        icmp6.setsockopt(IPPROTO_IPV6, IPV6_MULTICAST_IF, ifindex)
        icmp6.bind((v6[0], 0, 0, ifindex))  # source: the pod has no link-local (addrgen off)
        for ip in v6:
            for _ in range(repeat):
                icmp6.sendto(unsolicited_na(mac, ip), ("ff02::1", 0, 0, ifindex))
    finally:
        icmp6.close()
