"""``cni-tool doctor``: check an RDMA node the way TKE's guide's verification steps do, one line per
check (OK/WARN/FAIL with the fix), exit code 1 when anything FAILs (usable as a readiness probe).
"""

from __future__ import annotations

import os

import click

from rdma_cni.doctor.diagnose import diagnose_until
from rdma_cni.doctor.findings import exit_code, render_json, render_text
from rdma_cni.doctor.node import NodePaths


def node_options(func: click.decorators.FC) -> click.decorators.FC:
    """Where to look: shared by ``doctor`` and ``state``."""
    options = [
        click.option(
            "--sysfs-root", default="/sys", show_default=True, help="where class/infiniband is read"
        ),
        click.option("--netns", default="", help="the node's netns as a path (default: the current one)"),
        click.option("--cni-bin-dir", default="/opt/cni/bin", show_default=True),
        click.option("--conf-dir", default="/etc/cni/net.d", show_default=True),
        click.option("--kubelet-root-dir", default="/var/lib/kubelet", show_default=True),
        click.option(
            "--pod-resources-dir",
            default="",
            help="kubelet's PodResources socket dir (default <kubelet-root-dir>/pod-resources)",
        ),
        click.option("--data-dir", default="", help="rdma-macvlan state (default: the installed config's)"),
        click.option("--run-dir", default="", help="GID records (default: the installed config's)"),
        click.option(
            "--cache-dir",
            "cache_dirs",
            multiple=True,
            help="libcni caches to find pod names in (default /var/lib/cni, /var/lib/cni/rdma-multus)",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def paths_from(opts: dict[str, object]) -> NodePaths:
    """The click options of :func:`node_options` -> NodePaths."""
    caches = opts.get("cache_dirs") or ()
    results_dirs = tuple(str(c) for c in caches) if isinstance(caches, tuple | list) else ()
    return NodePaths(
        sysfs_root=str(opts["sysfs_root"]),
        netns=str(opts["netns"]),
        cni_bin_dir=str(opts["cni_bin_dir"]),
        conf_dir=str(opts["conf_dir"]),
        kubelet_root_dir=str(opts["kubelet_root_dir"]),
        pod_resources_dir=str(opts.get("pod_resources_dir") or ""),
        data_dir=str(opts["data_dir"]),
        run_dir=str(opts["run_dir"]),
        results_dirs=results_dirs or NodePaths.results_dirs,
    )


@click.command("doctor")
@node_options
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON")
@click.option("--pods", is_flag=True, help="also show, per pod, which GPU and RDMA NIC share a PCIe root")
@click.option(
    "--kubeconfig",
    default="",
    help="with --pods: the API server for DRA devices' ResourceSlices (default: the pod's ServiceAccount, "
    "else <conf-dir>/rdma-multus.d/rdma-multus.kubeconfig)",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="while anything FAILs, look again every second for up to this many seconds (the DaemonSet's "
    "readiness probe: its containers start together, the device plugin a moment after the probe)",
)
@click.pass_context
def doctor(
    ctx: click.Context, /, as_json: bool, pods: bool, kubeconfig: str, wait: float, **opts: object
) -> None:
    """Check this node's RDMA prerequisites and the rdma-cni installation (exit 1 on any FAIL)."""
    paths = paths_from(opts)
    access = None
    if pods:
        from rdma_cni.doctor.pod_view import api_config  # lazy: ~65 ms, only for --pods (see diagnose)

        access = api_config(kubeconfig, paths.conf_dir, os.environ)
    findings = diagnose_until(paths, wait, access)
    click.echo(render_json(findings) if as_json else render_text(findings), nl=False)
    ctx.exit(exit_code(findings))
