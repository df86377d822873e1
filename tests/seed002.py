"""Seed 002's Mellanox k8s-rdma-shared-dev-plugin ConfigMap ``config.json``, as the seed has it.

Read from the seed file itself (``/work/shared/seeds/002_9101a85ea38298f1.txt``: the
``kubectl apply`` of ConfigMap ``rdma-devices``, key ``config.json``) when it is there; ``COPY`` is
that text verbatim, for machines without the seeds (a test checks the two agree).
"""

from __future__ import annotations

import json
import os
import textwrap
from typing import Any

SEED = "/work/shared/seeds/002_9101a85ea38298f1.txt"
# Mounted by Mellanox's DaemonSet (deployment/k8s/base) from the ConfigMap: what --config names.
MOUNT_PATH = "/k8s-rdma-shared-dev-plugin/config.json"

COPY = """\
{
    "periodicUpdateInterval": 300,
    "configList": [
        {
            "resourceName": "hca_shared_devices_a",
            "resourcePrefix": "rdma",
            "rdmaHcaMax": 200,
            "selectors": {
                "ifNames": ["ibs108"]
            }
        }
    ]
}
"""


def from_seed(path: str = SEED) -> str | None:
    """The ``config.json: |`` block of the seed's ConfigMap, dedented; None without the seed."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "config.json: |")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    block = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"


def config_text() -> str:
    return from_seed() or COPY


def config() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(config_text())
    return doc


def with_second_pool(entry: dict[str, Any]) -> str:
    """The seed's config.json with one more ``configList`` entry (seed 002 deploys one pool)."""
    doc = config()
    doc["configList"].append(entry)
    return json.dumps(doc, indent=4)
