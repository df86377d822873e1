"""The real-kernel end-to-end scenario of rdma-cni; runs inside the vm-e2e guest
(``PYTHONPATH=scripts/vm python3 -m scenario``: this folder, one module per section, in the order they
run).

Started by ``scripts/vm-e2e scenario`` on Debian's stock kernel, as root, in a throw-away VM. It
builds the product's node layout — active-backup bonds over veth "cables", a Soft-RoCE device per
bond named like the product (``mlx5_bond_N``), addresses from 198.51.100.0/24 — and then:

* ``kernel``: moves addresses with plain ``ip`` commands (no project code) and dumps the real GID
  table after every step: the kernel facts the plugin relies on, and the trace a GID-table model
  (``rdma_cni/sim``) is compared against.
* ``plugin``: runs the real ``rdma-macvlan`` plugin through the CNI protocol for two pods on two
  bonds: GID index in the pod equals the host's, RDMA traffic between the pods, DEL with the netns
  alive and already deleted, secondary address, idempotent DEL.
* ``crash``: kill -9 / failures mid-ADD, then DEL or GC.
* ``reboot``: a pod holding bond0's IPv4 and IPv6 (both GIDs at the host's index), its netns gone,
  bond0 re-addressed by the node's config: DEL keeps the new addresses, the new IPv4's GID sits at
  the unified index, ``gid/host.json`` follows.
* ``dualstack``: bond1's IPv6 added before its IPv4 (its GID at the lower index): a pod takes both,
  each family's GID sits at its host index in the pod and again after DEL.
* ``exclusive``: the kernel in ``exclusive`` RDMA netns mode: ADD fails clearly and changes nothing.

``VM_E2E_SECTIONS=setup,dualstack`` runs only the sections named (``setup`` builds the node; a
developer's quick look at one section: the others are then reported as skipped).

Every outcome is one JSON line in ``$VM_OUT/results.jsonl`` (``kind`` check/fact/skip; a check has
``ok``, ``expected``, ``actual``); ``tests/vm/test_vm_e2e.py`` asserts on them. The GID table is read
here with plain ``open`` calls — an oracle independent of the project's own reader, which is
cross-checked against it. Few processes are spawned: under TCG each costs ~0.25 s.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from .crash import crash_section
from .dualstack import dualstack_section
from .exclusive import exclusive_section
from .kernel import kernel_section
from .node import build_node
from .plugin import plugin_section
from .reboot import reboot_section
from .report import STATE, R
from .shared import shared_section


def main() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    build_ok = True
    # VM_E2E_SECTIONS=setup,shared: only those sections, for a quicker look at one part
    wanted = [n for n in os.environ.get("VM_E2E_SECTIONS", "").split(",") if n]
    for name, section in (
        ("setup", build_node),
        ("kernel", kernel_section),
        ("plugin", plugin_section),
        ("crash", crash_section),
        ("shared", shared_section),
        ("reboot", reboot_section),
        ("dualstack", dualstack_section),
        ("exclusive", exclusive_section),
    ):
        R.section = name
        if not build_ok:
            R.skip(name, "the node layout could not be built")
            continue
        if wanted and name not in wanted:
            R.skip(name, f"not in VM_E2E_SECTIONS={','.join(wanted)}")
            continue
        t0 = time.monotonic()
        try:
            section()
        except Exception as e:  # noqa: BLE001 - a crashed section is reported, the next one still runs
            R.check("section ran to the end", None, f"{type(e).__name__}: {e}", traceback.format_exc())
            build_ok = name != "setup"
        R.fact("section seconds", round(time.monotonic() - t0, 1))
    R.section = "summary"
    R.fact("checks failed", R.failed)
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
