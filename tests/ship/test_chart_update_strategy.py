"""The chart's rolling update (values.yaml updateStrategy, daemonset.yaml): a node's new pod beside the
old one with the device plugin, one node at a time with the DRA driver, never a pair the API refuses,
and nothing that keeps the surge pod off its node (a hostPort). Rendered by real helm."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from cluster import chart


def daemonset(*sets: str) -> dict[str, Any]:
    (ds,) = [d for d in yaml.safe_load_all(chart.template(*sets)) if d and d["kind"] == "DaemonSet"]
    return ds


def api_accepts(strategy: dict[str, Any]) -> bool:
    """The DaemonSet validation's rule for RollingUpdate: exactly one of maxSurge and maxUnavailable
    is not zero."""
    rolling = strategy.get("rollingUpdate", {})
    nonzero = [k for k in ("maxSurge", "maxUnavailable") if str(rolling.get(k, 0)) not in ("0", "0%")]
    return strategy["type"] != "RollingUpdate" or len(nonzero) == 1


def test_the_device_plugin_daemonset_surges_a_nodes_new_pod_and_waits_a_margin_after_ready() -> None:
    ds = daemonset()
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert ds["spec"]["minReadySeconds"] > 0
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    ports = [p for c in spec["containers"] + spec["initContainers"] for p in c.get("ports", [])]
    assert ports == []  # hostNetwork turns every declared port into a hostPort


@pytest.mark.parametrize(
    ("sets", "rolling"),
    [
        (("--set", "frontEnd=dra"), {"maxUnavailable": 1}),
        (("--set", "updateStrategy.rollingUpdate.maxUnavailable=2"), {"maxUnavailable": 2}),
        (("--set", "updateStrategy.rollingUpdate.maxSurge=0", "--set",
          "updateStrategy.rollingUpdate.maxUnavailable=1"), {"maxUnavailable": 1}),
        (("--set", "frontEnd=dra", "--set", "updateStrategy.rollingUpdate.maxUnavailable=3"),
         {"maxUnavailable": 3}),
    ],
    ids=["dra", "max-unavailable-2", "older-kubelet", "dra-max-unavailable-3"],
)
def test_one_node_at_a_time_with_the_dra_driver_or_a_max_unavailable(sets: tuple[str, ...],
                                                                      rolling: dict[str, Any]) -> None:
    strategy = daemonset(*sets)["spec"]["updateStrategy"]
    assert strategy["rollingUpdate"] == rolling
    assert api_accepts(strategy)


def test_every_rendered_strategy_is_one_the_api_accepts() -> None:
    for sets in [(), ("--set", "frontEnd=dra"), ("--set", "updateStrategy.type=OnDelete")]:
        assert api_accepts(daemonset(*sets)["spec"]["updateStrategy"]), sets


def test_the_readiness_reads_the_status_its_own_pods_device_plugin_writes() -> None:
    """Not the node's status.json, which during a surge may still be the old pod's plugin's."""
    spec = daemonset()["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    dp, refresh = containers["rdma-device-plugin"], containers["refresh"]
    written = dp["args"][dp["args"].index("--pod-status") + 1]
    probe = refresh["readinessProbe"]["exec"]["command"]
    read = probe[probe.index("--host-root") + 1] + probe[probe.index("--device-plugin-status") + 1]
    volumes = {v["name"]: v for v in spec["volumes"]}

    def volume_at(c: dict[str, Any], path: str) -> str:
        (name,) = [m["name"] for m in c["volumeMounts"] if path.rsplit("/", 1)[0] == m["mountPath"]]
        return name

    name = volume_at(dp, written)
    assert volume_at(refresh, read) == name and "emptyDir" in volumes[name]
    assert read.endswith(written)


def plugin_containers(*sets: str) -> list[dict[str, Any]]:
    spec = daemonset(*sets)["spec"]["template"]["spec"]
    return [c for c in spec["containers"] if c["name"].startswith("rdma-device-plugin")]


def _arg(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    return str(args[args.index(flag) + 1])


def test_one_device_plugin_container_by_default_and_two_each_with_its_own_status_file() -> None:
    (one,) = plugin_containers()
    assert one["name"] == "rdma-device-plugin"
    assert _arg(one, "--pod-status") == "/run/rdma-cni-pod/status.json"  # what the readiness reads
    first, second = plugin_containers("--set", "devicePlugin.instances=2")
    assert (first["name"], second["name"]) == ("rdma-device-plugin", "rdma-device-plugin-2")
    assert _arg(second, "--pod-status") == "/run/rdma-cni-pod/status-2.json"
    same = {k: v for k, v in first.items() if k not in ("name", "args")}
    assert {k: v for k, v in second.items() if k not in ("name", "args")} == same
    assert [a for a in first["args"] if "status" not in a] == [a for a in second["args"] if "status" not in a]


@pytest.mark.parametrize("count", ["0", "3"])
def test_the_schema_refuses_an_instance_count_other_than_one_or_two(count: str) -> None:
    with pytest.raises(RuntimeError, match="instances"):
        chart.template("--set", f"devicePlugin.instances={count}")


def test_the_dra_front_end_runs_no_device_plugin_whatever_the_instance_count() -> None:
    assert plugin_containers("--set", "frontEnd=dra", "--set", "devicePlugin.instances=2") == []
