"""An attachment's pod interfaces: find the pod netns it recorded, pick their link group, delete
the interfaces (one group request) and the ``from`` rules ADD made beside them.

Shared by every plugin that makes child links of the node's bonds in a pod (rdma-macvlan's
macvlans, rdma-ipvlan's ipvlans or macvlans): each works from its write-ahead record alone, so DEL
needs neither the config nor the pod's cooperation.

    ns = recorded_netns(rec, req.netns)       # None: gone, or the path now names another netns
    if ns: delete_pod_rules(rec, ns); delete_pod_links(rec, ns, kinds=("ipvlan",))
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection

from rdma_cni.attachments import AttachmentRecord
from rdma_cni.net import links, pod_routing
from rdma_cni.net.netns import Netns, NetnsUnavailable, netlink_in, open_netns

log = logging.getLogger("rdma_cni.pod_links")

LINK_GROUP_FIRST = 1 << 16  # pod interfaces' link groups: 65536 ... 2**31-1 (hashed start, then probed)
LINK_GROUP_SPAN = (1 << 31) - LINK_GROUP_FIRST


def delete_pod_rules(rec: AttachmentRecord, ns: Netns) -> None:
    """The ``from <address>`` rules ADD created: unlike routes they do not go with the interface."""
    rules = [r for b in rec.bonds for r in b.pod_rules]
    if not rules:
        return
    pod = netlink_in(ns)
    try:
        pod_routing.remove_rules(pod, rules)
    finally:
        pod.close()


def recorded_netns(rec: AttachmentRecord, netns_path: str) -> Netns | None:
    """The pod netns, opened, if it still exists and is the recorded one (inode); else None."""
    for path in [p for p in dict.fromkeys([netns_path, rec.netns]) if p]:
        try:
            ns = open_netns(path)
        except NetnsUnavailable as exc:
            log.info("pod netns %s: %s; its interfaces went with it", path, exc.msg)
            continue
        if ns.inode == rec.netns_inode:
            return ns
        log.warning(
            "netns %s is now another namespace (inode %d, recorded %d): not touched",
            path,
            ns.inode,
            rec.netns_inode,
        )
        ns.close()
    return None


def pick_link_group(rec: AttachmentRecord, pod_links: list[links.Link]) -> int:
    """The link group for this attachment's pod interfaces: one that no link of the pod netns is in
    (``eth0`` and ``lo`` stay in group 0), starting from a number hashed from the attachment, above
    the small numbers an admin would pick by hand. Two attachments of one pod whose ADDs overlap
    (neither's links exist yet when the other looks) start from different numbers; should they
    still meet, DEL sees a stranger in the group and deletes one by one (delete_together)."""
    taken = {link.group for link in pod_links}
    start = LINK_GROUP_FIRST + zlib.crc32(f"{rec.container_id}@{rec.ifname}".encode()) % LINK_GROUP_SPAN
    return links.free_group(taken, start)


def delete_pod_links(rec: AttachmentRecord, ns: Netns, kinds: Collection[str] = ("macvlan",)) -> None:
    """Delete the attachment's pod interfaces, all of them with one request by link group (one
    kernel grace period for all bonds), verified by index; one by one when that cannot be done."""
    pod = netlink_in(ns)
    try:
        present = links.all_links(pod)
        names = {name for b in rec.bonds for name in (b.pod_ifname, b.temp_name)}
        # Ours: a link of our kind with one of our names (nothing else has that name in this netns).
        ours = [link for link in present if link.name in names and link.kind in kinds]
        done = links.delete_together(pod, ours, rec.link_group, present)
        if done.batched:
            log.debug(
                "pod interfaces %s of %s/%s deleted with one request (link group %d)",
                [link.name for link in ours],
                rec.container_id,
                rec.ifname,
                rec.link_group,
            )
        elif ours and rec.link_group:
            log.warning(
                "pod interfaces of %s/%s deleted one by one: %s", rec.container_id, rec.ifname, done.why
            )
        if done.others_gone:
            log.error(
                "while deleting the pod interfaces of %s/%s, %s vanished too (put into link group %d "
                "by someone else?)",
                rec.container_id,
                rec.ifname,
                ", ".join(done.others_gone),
                rec.link_group,
            )
    finally:
        pod.close()
