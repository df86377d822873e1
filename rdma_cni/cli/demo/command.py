"""``scripts/demo``'s command line: which demo to run (TKE's exclusive or shared RDMA mode, in which
cluster network mode), checked before anything is built.

    $ python3 -m rdma_cni.cli.demo --mode shared --bonds 4
"""

from __future__ import annotations

import argparse
import os
import sys

from rdma_cni.cli import demo
from rdma_cni.cli.demo import exclusive, shared
from rdma_cni.cli.demo.node import MODES, RDMA_MODES
from rdma_cni.cli.demo.shell import sweep_leftovers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=(demo.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bonds", type=int, default=4, help="bond NICs on the node (default 4)")
    parser.add_argument(
        "--mode",
        action="append",
        choices=[*sorted(MODES), *RDMA_MODES],
        default=[],
        help="the cluster network mode (vpc-cni, the default, or global-router) and/or the RDMA mode "
        "(exclusive, the default: rdma-macvlan; shared: rdma-ipvlan and a shared pool); twice for both",
    )
    parser.add_argument("--pod-bonds", type=int, default=2, help="RDMA NICs the pod asks for (default 2)")
    parser.add_argument(
        "--bundle",
        default="",
        help="use the PyInstaller bundle in DIR (scripts/build), "
        "installed with scripts/install.sh, instead of the Python entry points",
    )
    args = parser.parse_args(argv)
    network, rdma_mode = _modes(parser, args.mode)
    if rdma_mode == "shared":
        args.pod_bonds = args.bonds  # every pod gets a child of every bond
    if os.geteuid() != 0:
        sys.stderr.write("demo: needs root (it creates network namespaces)\n")
        return 2
    if not 1 <= args.pod_bonds <= args.bonds <= 8:
        sys.stderr.write("demo: need 1 <= --pod-bonds <= --bonds <= 8\n")
        return 2
    sweep_leftovers()
    bundle = os.path.abspath(args.bundle) if args.bundle else ""
    if rdma_mode == "shared":
        return shared.run_demo(args.bonds, bundle, network)
    return exclusive.run_demo(args.bonds, args.pod_bonds, bundle, network)


def _modes(parser: argparse.ArgumentParser, given: list[str]) -> tuple[str, str]:
    """(cluster network mode, RDMA mode) of the ``--mode`` values: one of each at most."""
    networks = {m for m in given if m in MODES}
    rdma = {m for m in given if m in RDMA_MODES}
    if len(networks) > 1 or len(rdma) > 1:
        parser.error(f"--mode {' --mode '.join(given)}: one cluster network mode and one RDMA mode at most")
    return next(iter(networks), "vpc-cni"), next(iter(rdma), "exclusive")

