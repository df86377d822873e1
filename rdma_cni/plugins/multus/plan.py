"""What rdma-multus is about to run for one pod interface, written to disk before anything runs.

DEL must work when the pod object, the API server and the netns are all gone (containerd's second
DEL has no netns and no prevResult), and a crash (kill -9) between two delegates must leave enough to
undo the first. So ADD records the full plan — every delegate's config, interface name and
arguments — atomically, before the first delegate runs; DEL replays it in reverse and removes it only
when every delegate's DEL succeeded.

    <cacheDir>/attachments/<containerID>-<ifname>.json
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from rdma_cni import durable
from rdma_cni.cni.errors import STATE_CORRUPT, CniError
from rdma_cni.cni.request import validate_container_id, validate_ifname
from rdma_cni.plugins.multus.delegates import Delegate

log = logging.getLogger("rdma_cni.multus")

SUBDIR = "attachments"


@dataclass
class AttachmentPlan:
    """The delegates of one pod interface, in the order ADD runs them (see the module doc)."""

    container_id: str
    ifname: str
    netns: str
    pod: dict[str, str] = field(default_factory=dict)  # namespace, name, uid: for humans and GC logs
    delegates: list[Delegate] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "containerID": self.container_id,
            "ifname": self.ifname,
            "netns": self.netns,
            "pod": self.pod,
            "delegates": [d.to_dict() for d in self.delegates],
        }


class PlanStore:
    def __init__(self, cache_dir: str) -> None:
        self.directory = os.path.join(cache_dir, SUBDIR)

    def path(self, container_id: str, ifname: str) -> str:
        validate_container_id(container_id)
        validate_ifname(ifname)
        return os.path.join(self.directory, f"{container_id}-{ifname}.json")

    def save(self, plan: AttachmentPlan) -> None:
        durable.atomic_write_json(self.path(plan.container_id, plan.ifname), plan.to_dict())

    def load(self, container_id: str, ifname: str) -> AttachmentPlan | None:
        return self._read(self.path(container_id, ifname))

    def remove(self, container_id: str, ifname: str) -> None:
        durable.remove(self.path(container_id, ifname))

    def plans(self) -> Iterator[AttachmentPlan]:
        """Every readable plan; an unreadable one is logged and skipped so GC still heals the rest."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                plan = self._read(os.path.join(self.directory, name))
            except CniError as exc:
                log.warning("skipping %s: %s", name, exc.msg)
                continue
            if plan is not None:
                yield plan

    def _read(self, path: str) -> AttachmentPlan | None:
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
            return AttachmentPlan(
                container_id=str(raw["containerID"]),
                ifname=str(raw["ifname"]),
                netns=str(raw.get("netns", "")),
                pod={str(k): str(v) for k, v in (raw.get("pod") or {}).items()},
                delegates=[Delegate.from_dict(d) for d in raw["delegates"]],
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CniError(STATE_CORRUPT, f"rdma-multus cache {path} is unreadable: {exc}") from exc
