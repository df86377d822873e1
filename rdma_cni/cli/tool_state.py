"""``cni-tool state``: which bonds are pinned to which container and pod, and what the host is
missing right now (addresses pinned to a pod whose netns is gone, bonds that lost their IP).
"""

from __future__ import annotations

import click

from rdma_cni.cli.tool_doctor import node_options, paths_from
from rdma_cni.doctor import shared_pools
from rdma_cni.doctor.inventory import inventory, render_inventory, render_inventory_json
from rdma_cni.doctor.node import observe


@click.command("state")
@node_options
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_context
def state(ctx: click.Context, /, as_json: bool, **opts: object) -> None:
    """Show pins (bond -> container/pod, next to the pod kubelet gave its device to) and the addresses
    the host is missing (exit 1 if any, or if a bond's IP is held by another pod than kubelet's)."""
    import json

    paths = paths_from(opts)
    inv = inventory(observe(paths))
    # Shared mode (rdma-ipvlan): per bond its subnet, the free and held addresses and who holds them.
    pools = shared_pools.observe(paths.conf_dir, paths.netns, paths.sysfs_root)
    if as_json:
        body = json.loads(render_inventory_json(inv))
        if pools is not None:
            body["sharedPools"] = shared_pools.as_json(pools)
        click.echo(json.dumps(body, indent=1))
    else:
        text = render_inventory(inv)
        click.echo(text + (shared_pools.render(pools) if pools is not None else ""), nl=False)
    ctx.exit(1 if inv["missing"] or inv["unreadableState"] or inv["allocationFailures"] else 0)
