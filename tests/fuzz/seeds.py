"""Each fuzz target's seed inputs: what the shipped configs, TKE's guide and Multus's docs write, and
the attempts tried as a tenant (tests/core/test_tenant_node.py), so the fuzzer starts from real shapes."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _file(path: str) -> bytes:
    return (REPO / path).read_bytes()


def _conf(**keys: object) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "n", **keys}).encode()


SEEDS: dict[str, list[bytes]] = {
    "request": [
        _file("conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf"),
        _conf(
            type="rdma-macvlan",
            deviceID="mlx5_bond_0",
            runtimeConfig={"deviceIDs": ["bond1"]},
            prevResult={
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0"}],
                "ips": [{"address": "198.51.100.2/28", "interface": 0}],
            },
        ),
    ],
    "macvlan-config": [
        _file("conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf"),
        _conf(
            type="rdma-macvlan",
            masters=["eth0"],
            podIfName="cni",
            rdma={"required": False},
            resourceName="example.com/none",
            dataDir="/tmp/x",
            ipam={"type": "host-local"},
        ),
    ],
    "ipvlan-config": [
        _file("conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf"),
        _conf(
            type="rdma-ipvlan",
            ranges={"bond0": ["198.51.100.4-198.51.100.14"]},
            exclude=["198.51.100.9", "198.51.100.12/30"],
            link="macvlan",
        ),
    ],
    "multus-config": [
        json.dumps(json.loads(_file("conf/vpc-cni/00-rdma-multus.conflist"))["plugins"][0]).encode()
    ],
    "annotation": [
        b"tke-route-eni,tke-rdma-macvlan",
        b"kube-system/tke-rdma-macvlan@rdma0,a/b@c",
        b'[{"name": "n", "namespace": "team-a", "interface": "net1", "mac": "02:00:00:00:00:01", '
        b'"ips": ["198.51.100.7/28"], "deviceID": "mlx5_bond_0", "cni-args": {"a": 1}}]',
    ],
    "nad": [
        json.dumps(
            {
                "metadata": {"annotations": {"k8s.v1.cni.cncf.io/resourceName": "x/y"}},
                "spec": {"config": json.dumps({"cniVersion": "1.0.0", "type": "rdma-macvlan"})},
            }
        ).encode(),
        json.dumps(
            {
                "spec": {
                    "config": json.dumps(
                        {
                            "cniVersion": "1.0.0",
                            "plugins": [{"type": "host-device", "device": "eth0"}, {"type": "tuning"}],
                        }
                    )
                }
            }
        ).encode(),
    ],
    "prev-result": [
        b'{"cniVersion": "1.1.0", "interfaces": [{"name": "bond0", "mac": "02:00:00:00:00:01", '
        b'"mtu": 1500, "sandbox": "/run/netns/p"}], "ips": [{"address": "198.51.100.2/28", '
        b'"gateway": "198.51.100.1", "interface": 0}], "routes": [{"dst": "0.0.0.0/0", '
        b'"gw": "198.51.100.1", "table": 100}], "dns": {"nameservers": ["198.51.100.53"]}}'
    ],
    "dra-claim": [
        json.dumps(
            {
                "metadata": {"uid": "u"},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "nic",
                                    "driver": "rdma.tke.cloud.tencent.com",
                                    "pool": "node-a",
                                    "device": "bond0",
                                    "shareID": "s",
                                }
                            ],
                            "config": [
                                {
                                    "source": "FromClaim",
                                    "requests": ["nic"],
                                    "opaque": {
                                        "driver": "rdma.tke.cloud.tencent.com",
                                        "parameters": {
                                            "apiVersion": "rdma.tke.cloud.tencent.com/v1alpha1",
                                            "kind": "RdmaConfig",
                                        },
                                    },
                                }
                            ],
                        }
                    }
                },
            }
        ).encode()
    ],
    "node-policy": [
        b'{"trust": "node", "bonds": ["bond0"], "paths": {"rdma-macvlan": {"dataDir": "/d"}}, '
        b'"networks": {"globalNamespaces": ["default"], "allowedTypes": ["rdma-macvlan"]}}'
    ],
}
