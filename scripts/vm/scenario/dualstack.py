"""Section ``dualstack``: bond1's IPv6 added before its IPv4: a pod takes both, each family's GID at its
host index in the pod and again after DEL."""

from __future__ import annotations

import json

from .cni import cni, gid_records, plugin_available, plugin_rdma_missing
from .host import addresses, addresses6, gid_table, host_snapshot, ip, v2_index, v2_index6, wait_for
from .report import BONDS, R


def dualstack_section() -> None:
    """A bond whose IPv6 appeared before its IPv4 (at boot, say): the IPv6 GID has the lower index.
    The pod's addresses must go in in the order of the host's GID indexes, so both families keep
    their host indexes in the pod (ADD checks each) and again when DEL gives them back."""
    missing = plugin_available() or plugin_rdma_missing()
    if missing:
        R.skip("dualstack", missing)
        return
    dev, (v4,), v6 = "mlx5_bond_1", BONDS["bond1"][2], "2001:db8:11::11/64"
    before = host_snapshot()
    ip([f"addr del {v4} dev bond1", f"addr add {v6} dev bond1 nodad"])
    wait_for(lambda: v2_index6(dev, v6) is not None, 5)
    ip([f"addr add {v4} dev bond1"])
    wait_for(lambda: v2_index(dev, v4) is not None, 5)

    def indexes() -> dict[str, int | None]:
        return {"gidIndex": v2_index(dev, v4), "gidIndexIPv6": v2_index6(dev, v6)}

    host = indexes()
    R.fact("dual-stack bond1, IPv6 first: GID table", gid_table(dev))
    h4, h6 = host["gidIndex"], host["gidIndexIPv6"]
    R.check("the IPv6 appeared first: its GID has the lower index", True,
            h4 is not None and h6 is not None and h6 < h4, host)
    ip(["netns add pod8"])
    try:
        rc, out, _ = cni("ADD", "pod8", "bond1")
        R.check("ADD pod8 (IPv6 before IPv4 on the host) exit code", 0, rc, out)
        record = json.loads(gid_records("pod8")[0].read_text()) if gid_records("pod8") else {}
        R.check("pod8's GID record: both families at the host's indexes", host,
                {k: record.get(k) for k in host}, record)
        R.check("pod8's GIDs at the host's indexes", host, indexes(), gid_table(dev))
        rc, out, _ = cni("DEL", "pod8", "bond1")
        R.check("DEL pod8 exit code", 0, rc, out)
        back = wait_for(lambda: indexes() == host, 5)
        R.check("after DEL both families are back at the host's indexes", host, indexes(), {"seconds": back})
        R.check("bond1 holds its IPv4 and IPv6 again", [[v4], [v6]],
                [addresses("bond1"), addresses6("bond1")])
    finally:
        ip(["netns del pod8"])
        ip([f"addr del {v6} dev bond1", f"addr del {v4} dev bond1", f"addr add {v4} dev bond1"])
        wait_for(lambda: v2_index(dev, v4) is not None, 5)
    R.check("host as before the section", before, host_snapshot())
