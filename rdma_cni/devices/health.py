"""Whether kubelet may hand an RDMA bond to a new pod: a pure verdict on what was observed.

Healthy means every one of these holds (DESIGN.md "rdma-device-plugin: behaviour"):

* the RDMA port is ``ACTIVE`` (sysfs ``ports/N/state``; it has no netlink event, hence the rescan);
* the bond netdev exists in the node's netns, is up and has carrier;
* the ``uverbsN`` char device exists under the dev root (what the pod opens);
* the bond holds an IPv4 (or a global IPv6) address, or a live pod holds it (rdma-macvlan moved
  it into that pod and gives it back on DEL). A bond that was re-addressed holds an address, so it
  is healthy (issue 12); a bond without one whose record's pod is gone lost its address
  (``cni-tool state`` / ``gc``).

The verdict is a function of an :class:`Observation` only, so recovery needs no special path: the
next scan re-evaluates and the cause that went away is no longer named.

    evaluate(bond, Observation(port_state="DOWN", ...))   # DeviceHealth(..., healthy=False, reason=...)
"""

from __future__ import annotations

from dataclasses import dataclass

from rdma_cni.devices.hca import Hca
from rdma_cni.devices.model import DeviceHealth, RdmaBond


@dataclass(frozen=True)
class Holder:
    """A pod (attachment record in ``dataDir``) that holds the bond's addresses."""

    container_id: str
    netns: str
    alive: bool  # its recorded netns still exists with the recorded inode


@dataclass(frozen=True)
class Observation:
    """What one scan saw of one bond. ``link_present=False`` makes the link fields meaningless."""

    port_state: str  # "ACTIVE", "DOWN", "INIT", "GONE" (the RDMA device left sysfs), ...
    link_present: bool
    link_up: bool
    carrier: bool
    ipv4: tuple[str, ...]  # the bond's IPv4 addresses in the node netns
    uverbs_node: str  # host path of the uverbs node checked, "" when sysfs names none
    uverbs_ok: bool  # a character device is there
    holders: tuple[Holder, ...] = ()
    ipv6: tuple[str, ...] = ()  # its global IPv6 addresses (an IPv6-only RoCE network is one too)


def causes(bond: RdmaBond, seen: Observation) -> list[str]:
    """Every reason the bond cannot be given out now, each naming what to look at."""
    out: list[str] = []
    if seen.port_state == "GONE":
        out.append(f"RDMA device {bond.id} is gone from sysfs (driver unloaded, or the bond's LAG broke up)")
    elif seen.port_state != "ACTIVE":
        out.append(f"RDMA port {bond.id}/{bond.port} is {seen.port_state}, not ACTIVE "
                   "(check the bond's slaves, the cable and the switch port)")
    if not seen.link_present:
        out.append(f"bond {bond.netdev} is missing from the node's network namespace")
    elif not seen.link_up:
        out.append(f"bond {bond.netdev} is down (`ip link set {bond.netdev} up`)")
    elif not seen.carrier:
        out.append(f"bond {bond.netdev} has no carrier (no slave link is up)")
    if not seen.uverbs_node:
        out.append(f"no uverbs device names {bond.id} in class/infiniband_verbs (is ib_uverbs loaded?)")
    elif not seen.uverbs_ok:
        out.append(f"{seen.uverbs_node} is missing or not a character device (is ib_uverbs loaded?)")
    if address_lost(seen):
        out.append(_address_cause(bond, seen.holders))
    return out


def address_lost(seen: Observation) -> bool:
    """The bond is there without an address, and no live pod holds it (one lent to a live pod is
    fine: DEL gives it back)."""
    return seen.link_present and not seen.ipv4 and not seen.ipv6 and not any(h.alive for h in seen.holders)


def _address_cause(bond: RdmaBond, holders: tuple[Holder, ...]) -> str:
    if holders:
        dead = holders[0]
        return (f"bond {bond.netdev} has no IP address: container {dead.container_id[:12]} holds it "
                f"but its netns {dead.netns or '(none)'} is gone (`cni-tool gc` gives it back)")
    return (f"bond {bond.netdev} has no IPv4 (nor global IPv6) address and no pod holds it: the node "
            "lost it (see `cni-tool state`; give the bond its address back)")


def evaluate(bond: RdmaBond, seen: Observation) -> DeviceHealth:
    found = causes(bond, seen)
    return DeviceHealth(id=bond.id, healthy=not found, reason="; ".join(found))


# --- an HCA of a shared pool -------------------------------------------------------------------------


@dataclass(frozen=True)
class HcaObservation:
    """What one scan saw of one HCA of a shared pool (its netdev: the RoCE bond, or the IPoIB one)."""

    port_state: str
    netdev_present: bool
    netdev_up: bool
    carrier: bool
    uverbs_node: str
    uverbs_ok: bool


def hca_causes(hca: Hca, seen: HcaObservation) -> list[str]:
    """Why a shared pool cannot count on ``hca`` now. The address is not asked for: in shared mode
    the bond keeps its own and each pod gets another (TKE's IPVLAN), and a hostNetwork pool
    (Mellanox's shared device plugin guide) needs none. InfiniBand: port ACTIVE, and its IPoIB
    netdev up when it has one."""
    out: list[str] = []
    if seen.port_state == "GONE":
        out.append(f"RDMA device {hca.id} is gone from sysfs (driver unloaded?)")
    elif seen.port_state != "ACTIVE":
        fix = "the cable, the switch port or the subnet manager" if hca.infiniband else "the bond's slaves"
        out.append(f"RDMA port {hca.id}/{hca.port} is {seen.port_state}, not ACTIVE (check {fix})")
    if hca.netdev is None:
        if not hca.infiniband:
            out.append(f"no netdev carries the RoCE GIDs of {hca.id}")
    elif not seen.netdev_present:
        out.append(f"netdev {hca.netdev} of {hca.id} is missing from the node's network namespace")
    elif not seen.netdev_up:
        out.append(f"netdev {hca.netdev} of {hca.id} is down (`ip link set {hca.netdev} up`)")
    elif not seen.carrier and not hca.infiniband:
        out.append(f"netdev {hca.netdev} of {hca.id} has no carrier")
    if not seen.uverbs_node:
        out.append(f"no uverbs device names {hca.id} in class/infiniband_verbs (is ib_uverbs loaded?)")
    elif not seen.uverbs_ok:
        out.append(f"{seen.uverbs_node} is missing or not a character device (is ib_uverbs loaded?)")
    return out


def evaluate_hca(hca: Hca, seen: HcaObservation) -> DeviceHealth:
    found = hca_causes(hca, seen)
    return DeviceHealth(id=hca.id, healthy=not found, reason="; ".join(found))
