"""Section ``reboot``: a pod holding bond0's IPv4 and IPv6, its netns gone, bond0 re-addressed by the
node's config: DEL keeps the new addresses and the new IPv4's GID sits at the unified index."""

from __future__ import annotations

import json

from .cni import cni, gid_records, plugin_available, plugin_rdma_missing, result_ips
from .host import addresses, addresses6, gid_table, ip, v2_index, v2_index6, wait_for
from .report import BONDS, STATE, R


def reboot_section() -> None:
    """A reboot-like step on real GID tables, in two plugin calls (each costs seconds under TCG):
    bond0 also holds an IPv6, a pod takes both (the pod's IPv6 GID must keep the host's index: the
    plugin checks it); its netns vanishes without DEL and the node's config gives bond0 a different
    IPv4 and IPv6 while the record still holds the old ones. DEL (CNI_NETNS empty, as containerd
    sends it) must keep what the bond holds now, with the new IPv4's GID at the unified index."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("reboot", missing)
        return
    dev, old4, old6 = "mlx5_bond_0", list(BONDS["bond0"][2]), "2001:db8:10::10/64"
    new4, new6 = "198.51.100.40/24", "2001:db8:10::40/64"
    unified = v2_index(dev, old4[0])
    ip(["netns add pod7", f"addr add {old6} dev bond0 nodad"])
    wait_for(lambda: v2_index6(dev, old6) is not None, 5)
    host6 = v2_index6(dev, old6)
    R.check("the bond's IPv6 has a RoCE v2 GID (the address itself)", True, host6 is not None)
    rc, out, _ = cni("ADD", "pod7", "bond0")
    R.check("ADD pod7 (IPv4 + IPv6) exit code", 0, rc, out)
    R.check("pod7 got the bond's IPv4 and IPv6", sorted([*old4, old6]), result_ips(out))
    record = json.loads(gid_records("pod7")[0].read_text()) if gid_records("pod7") else {}
    R.check("pod7's GID record: the host's IPv4 and IPv6 indexes",
            {"gidIndex": unified, "gidIndexIPv6": host6},
            {k: record.get(k) for k in ("gidIndex", "gidIndexIPv6")}, record)
    ip(["netns del pod7"])
    gone = wait_for(lambda: all(v2_index(dev, a) is None for a in old4) and v2_index6(dev, old6) is None, 10)
    R.check("the pod's GIDs leave with its netns", True, gone is not None)
    ip([f"addr add {new4} dev bond0", f"addr add {new6} dev bond0 nodad"])  # the node's new config
    rc, out, _ = cni("DEL", "pod7", "bond0", netns="")
    R.check("DEL after the re-address: exit code", 0, rc, out)
    R.check("bond0 keeps only its new IPv4 and IPv6", [[new4], [new6]],
            [addresses("bond0"), addresses6("bond0")])
    R.check("none of the record's addresses came back (no GID)", [None] * (len(old4) + 1),
            [v2_index(dev, a) for a in old4] + [v2_index6(dev, old6)])
    idx4, idx6 = v2_index(dev, new4), v2_index6(dev, new6)
    R.fact("GID table after the skipped restore", gid_table(dev))
    R.check("the new IPv4's GID is at the unified index", unified, idx4)
    R.check("the new IPv6 has a RoCE v2 GID", True, idx6 is not None)
    host = json.loads((STATE / "run" / "gid" / "host.json").read_text())
    port = next((p for p in host.get("ports", []) if p.get("device") == dev), {})
    R.check("host.json follows what the bond holds",
            {"ipv4": new4.split("/")[0], "gidIndex": idx4, "present": True, "ipv6": new6.split("/")[0],
             "gidIndexIPv6": idx6},
            {k: port.get(k) for k in ("ipv4", "gidIndex", "present", "ipv6", "gidIndexIPv6")}, host)
    left = sorted(p.name for p in (STATE / "data" / "attachments").glob("*.json"))
    R.check("nothing pinned any more", [], left)
    ip([f"addr del {new6} dev bond0", f"addr del {new4} dev bond0",
        *[f"addr add {a} dev bond0" for a in old4]])  # the node as the next section expects it
