"""Refuse a ``CNI_NETNS`` that is the plugin's own network namespace (what the Go skel does).

A runtime bug or a wrong path (``/proc/1/ns/net`` from a host-network caller, a netns path that
is the node's) would otherwise make ADD treat the node as the pod: create the pod's interface on
the node and move the bond's addresses onto it. Compared by identity (device and inode of the nsfs
file), so another path to the same namespace is caught too. ``CNI_NETNS_OVERRIDE=1`` (or ``true``)
allows it on purpose, as in the Go library. A path that cannot be stat'ed is not ours: the verbs
report or tolerate it themselves (DEL of a gone netns must succeed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rdma_cni.cni.errors import INVALID_NETNS, CniError

GUARDED_VERBS = ("ADD", "DEL", "CHECK")
OWN_NETNS = "/proc/thread-self/ns/net"
# The spec's code 8 with the Go skel's own wording, so tooling that matches on it keeps working.
MESSAGE = "plugin's netns and netns from CNI_NETNS should not be the same"


def refuse_own_netns(command: str, env: Mapping[str, str]) -> None:
    netns = env.get("CNI_NETNS", "")
    if command not in GUARDED_VERBS or not netns or overridden(env):
        return
    try:
        target = os.stat(netns)
    except OSError:
        return
    own = os.stat(OWN_NETNS)
    if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
        raise CniError(
            INVALID_NETNS, MESSAGE,
            f"CNI_NETNS={netns} is the network namespace the plugin runs in (inode {own.st_ino}); "
            "nothing was changed. Pass the pod's netns, or set CNI_NETNS_OVERRIDE=1 to allow this",
        )


def overridden(env: Mapping[str, str]) -> bool:
    return env.get("CNI_NETNS_OVERRIDE", "").strip().lower() in ("1", "true")
