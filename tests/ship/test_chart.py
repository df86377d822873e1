"""The Helm chart charts/rdma-cni, through real helm (the test cluster's build of helm.sh/helm/v4):
``helm lint --strict``; conf/k8s/ is what it renders; the schema and the chart refuse bad values
naming the value; every variant is a value of the one template (kubeletRootDir moves every kubelet
path, shared mode's link reaches install.sh, Mellanox's config.json given with --set-file is the
commented variant switched on, the ServiceMonitor). What the manifests must be is test_conf_k8s's
and test_conf_dra's: the variants here are checked with their helpers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import seed002
import yaml
from cluster import chart

from tests.ship import test_conf_k8s as conf

pytestmark = [pytest.mark.helm]


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def daemonset(*sets: str) -> dict[str, Any]:
    return conf._checked_daemonset(docs(chart.template(*sets)))


def refused(*sets: str) -> str:
    proc = chart.run("template", chart.RELEASE, str(chart.CHART), "--namespace", chart.NAMESPACE, *sets)
    assert proc.returncode != 0, f"helm template {sets} was not refused"
    return proc.stderr


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["--set", "frontEnd=dra"],
        ["--set", "rdmaMode=shared", "--set", "metrics.serviceMonitor.enabled=true"],
    ],
)
def test_lint_strict_passes(sets: list[str]) -> None:
    proc = chart.run("lint", "--strict", str(chart.CHART), *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_conf_k8s_is_what_the_chart_renders() -> None:
    for path, text in chart.manifests().items():
        assert path.read_text() == text, f"{path}: differs from the chart; run scripts/render-manifests"


@pytest.mark.parametrize(
    ("flag", "named", "accepts"),
    [
        ("rdmaMode=sharde", "/rdmaMode", "'exclusive', 'shared'"),
        ("kubeletRootDir=data/kubelet", "/kubeletRootDir", "^/"),
        ("clusterNetwork=tke-bridge", "/clusterNetwork", "'vpc-cni', 'global-router'"),
        ("frontEnd=DRA", "/frontEnd", "'devicePlugin', 'dra'"),
        ("shared.link=vlan", "/shared/link", "'ipvlan', 'macvlan'"),
        ("metrics.port=0", "/metrics/port", "1"),
        ("rdmaModee=shared", "rdmaModee", "additional properties"),
        ("nodePolicy.bonds={bond0,../eth0}", "/nodePolicy/bonds/1", "^[A-Za-z0-9._-]{1,15}$"),
        ("nodePolicy.namespaceIsolation=maybe", "/nodePolicy/namespaceIsolation", "boolean"),
        ("nodePolicy.globalNamespaces={Default}", "/nodePolicy/globalNamespaces/0", "^[a-z0-9]"),
        ("metrics.bindAddress=localhost", "/metrics/bindAddress", "^[0-9]{1,3}"),
    ],
)
def test_the_schema_refuses_a_bad_value_naming_it_and_what_it_accepts(
    flag: str, named: str, accepts: str
) -> None:
    said = refused("--set", flag)
    assert named in said and accepts in said, said


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"rdmaHcaMax": -1}, "configList[0].rdmaHcaMax must be a whole number from 0"),
        ({"rdmaHcaMax": 1.5}, "configList[0].rdmaHcaMax must be a whole number from 0"),
    ],
)
def test_a_bad_mellanox_pool_is_refused_before_anything_is_applied(
    entry: dict[str, Any], said: str, tmp_path: Path
) -> None:
    cfg = seed002.config()
    cfg["configList"][0].update(entry)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    err = refused("--set-file", f"devicePlugin.mellanoxConfig={path}")
    assert "devicePlugin.mellanoxConfig" in err and said in err, err
    path.write_text("{not json")
    assert "not JSON" in refused("--set-file", f"devicePlugin.mellanoxConfig={path}")


def _kubelet_paths(text: str) -> list[str]:
    """Every kubelet path the rendered objects use (comments left out)."""
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    return sorted(set(re.findall(r"/[\w./-]*kubelet[\w./-]*", code)))


@pytest.mark.parametrize("front_end", ["devicePlugin", "dra"])
def test_kubelet_root_dir_moves_every_kubelet_path_consistently(front_end: str) -> None:
    root = "/data/kubelet"
    text = chart.template("--set", f"kubeletRootDir={root}", "--set", f"frontEnd={front_end}")
    # device-plugins/ is kubelet's constant path (its device manager ignores --root-dir); nothing
    # else may stay under /var/lib/kubelet.
    stays = [p for p in _kubelet_paths(text) if p.startswith("/var/lib/kubelet")]
    assert set(stays) <= {"/var/lib/kubelet/device-plugins"}, stays
    ds = conf._checked_daemonset(docs(text))
    name = "rdma-dra-driver" if front_end == "dra" else "rdma-device-plugin"
    c = conf._container(ds, name)
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert env["KUBELET_ROOT_DIR"] == root
    args = conf._expand(c["args"], env)
    mounts = conf._host_mounts(ds, c)
    if front_end == "dra":
        # kubelet dials the socket path the driver registers: mounted where the node has it
        wanted = [
            f"{root}/plugins/rdma.tke.cloud.tencent.com/dra.sock",
            f"{root}/plugins_registry/x-reg.sock",
        ]
    else:
        wanted = [args[args.index("--pod-resources-dir") + 1] + "/kubelet.sock"]
    for path in wanted:
        mount = conf._under(path, mounts)
        assert mount is not None and path.startswith(mounts[mount]["hostPath"]), (path, mounts)
        assert mount == mounts[mount]["hostPath"], "a kubelet path at another path in the container"
    # The installer and the doctor see the same root.
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    assert {e["name"]: e["value"] for e in init["env"]}["KUBELET_ROOT_DIR"] == root
    # The doctor run by hand in the refresh container (its troubleshooting note) reads kubelet's root
    # at /host<root>, and the loop re-installs with that root.
    refresh = conf._container(ds, "refresh")
    assert conf._host_mounts(ds, refresh)["/host" + root]["hostPath"] == root
    assert {e["name"]: e["value"] for e in refresh["env"]}["KUBELET_ROOT_DIR"] == root


def test_shared_mode_with_the_macvlan_link_reaches_the_node_in_both_install_commands(tmp_path: Path) -> None:
    ds = daemonset("--set", "rdmaMode=shared", "--set", "shared.link=macvlan")
    host = conf._install_node(ds, tmp_path, "shared")
    delegate = json.loads((host / "etc/cni/net.d/rdma-multus.d/tke-rdma-ipvlan.conf").read_text())
    assert delegate["link"] == "macvlan"
    loop = conf._container(ds, "refresh")["args"][0]
    assert "--shared-link macvlan \\\n" in loop and '--rdma-mode "$RDMA_MODE"' in loop
    # ipvlan (the default) adds nothing: the shipped config as it is.
    assert "--shared-link" not in chart.template("--set", "rdmaMode=shared")


def test_node_policy_values_reach_the_nodes_policy_file_in_both_install_commands(tmp_path: Path) -> None:
    from rdma_cni import node_policy

    ds = daemonset("--set", "nodePolicy.bonds={bond0,bond1}", "--set", "nodePolicy.namespaceIsolation=false",
                   "--set", "nodePolicy.globalNamespaces={default,shared-nets}",
                   "--set", "nodePolicy.allowedDelegateTypes={rdma-macvlan}",
                   "--set", "metrics.bindAddress=127.0.0.1")
    host = conf._install_node(ds, tmp_path, "exclusive")
    policy = node_policy.parse(json.loads((host / "etc/rdma-cni/node-policy.json").read_text()))
    assert policy.enforced and policy.bonds == ("bond0", "bond1")
    assert not policy.networks.namespace_isolation
    assert policy.networks.global_namespaces == ("default", "shared-nets")
    assert policy.networks.allowed_types == ("rdma-macvlan",)
    loop = conf._container(ds, "refresh")["args"][0]
    for option in ('--bonds "$POLICY_BONDS"', '--namespace-isolation "$POLICY_NAMESPACE_ISOLATION"',
                   '--global-namespaces "$POLICY_GLOBAL_NAMESPACES"',
                   '--allowed-types "$POLICY_ALLOWED_TYPES"'):
        assert option in loop, option
    refresh = {e["name"]: e["value"] for e in conf._container(ds, "refresh")["env"]}
    assert refresh["POLICY_BONDS"] == "bond0,bond1" and refresh["POLICY_NAMESPACE_ISOLATION"] == "false"
    agent = conf._container(ds, "rdma-agent")["args"]
    assert agent[agent.index("--metrics-address") + 1] == "127.0.0.1:9513"
    # the defaults: the netdevs behind RDMA devices, isolation on, the default namespace global
    (tmp_path / "d").mkdir()
    plain = conf._install_node(daemonset(), tmp_path / "d", "exclusive")
    default = node_policy.parse(json.loads((plain / "etc/rdma-cni/node-policy.json").read_text()))
    assert default.bonds is None and default.networks.namespace_isolation
    assert default.networks.global_namespaces == ("default",) and default.networks.allowed_types is None


@pytest.mark.parametrize("rdma_mode", ["exclusive", "shared"])
def test_meta_plugin_none_installs_our_plugins_and_no_meta_config_in_both_install_commands(
    tmp_path: Path, rdma_mode: str
) -> None:
    """Under upstream Multus (metaPlugin none) the node gets the delegates and their configs, and no
    00-rdma-multus.conflist that the runtime would pick before Multus's: one node, one meta plugin."""
    ds = daemonset("--set", "metaPlugin=none", "--set", f"rdmaMode={rdma_mode}")
    host = conf._install_node(ds, tmp_path, rdma_mode)
    net_d = host / "etc/cni/net.d"
    assert not (net_d / "00-rdma-multus.conflist").exists()
    delegate = "tke-rdma-macvlan.conf" if rdma_mode == "exclusive" else "tke-rdma-ipvlan.conf"
    assert (net_d / "rdma-multus.d" / delegate).exists()
    assert (host / "opt/cni/bin/rdma-cni.d/current").exists(), "the bundle (the plugins' binary)"
    refresh = {e["name"]: e["value"] for e in conf._container(ds, "refresh")["env"]}
    assert refresh["CLUSTER_MODE"] == ""
    assert "metaPlugin" in refused("--set", "metaPlugin=multus")


def test_mellanox_config_as_a_file_is_the_commented_variant_switched_on(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(seed002.config_text())
    rendered = docs(chart.template("--set-file", f"devicePlugin.mellanoxConfig={path}"))
    (cm,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert (
        cm["metadata"]["name"] == "rdma-devices"
        and cm["data"]["config.json"].strip() == path.read_text().strip()
    )
    ds = conf._checked_daemonset(rendered)
    ds["spec"]["template"]["metadata"]["annotations"].pop("rdma-cni/mellanox-config")
    variant = next(d for d in conf._variant("mellanox") if d["kind"] == "DaemonSet")
    assert ds == variant
    dra = conf._checked_daemonset(
        docs(chart.template("--set", "frontEnd=dra", "--set-file", f"devicePlugin.mellanoxConfig={path}"))
    )
    args = conf._container(dra, "rdma-dra-driver")["args"]
    assert args[args.index("/etc/rdma-cni/device-plugin.yaml") + 1 :][:2] == ["--config", seed002.MOUNT_PATH]


def test_service_monitor_when_asked_scrapes_the_agents_metrics_port() -> None:
    assert "ServiceMonitor" not in chart.template()
    rendered = docs(
        chart.template("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=9600")
    )
    (svc,) = [d for d in rendered if d["kind"] == "Service"]
    (sm,) = [d for d in rendered if d["kind"] == "ServiceMonitor"]
    assert svc["spec"]["ports"][0]["port"] == svc["spec"]["ports"][0]["targetPort"] == 9600
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"  # the Service's port name
    assert sm["spec"]["selector"]["matchLabels"] == svc["metadata"]["labels"] == {"k8s-app": "rdma-cni"}
    agent = conf._container(next(d for d in rendered if d["kind"] == "DaemonSet"), "rdma-agent")
    assert "ports" not in agent and agent["args"][-1] == "0.0.0.0:9600"


def test_every_value_reaches_the_daemonset() -> None:
    (ds,) = [d for d in docs(chart.template(
        "--set", "image.repository=registry.example/rdma-cni", "--set", "image.tag=0.1.1",
        "--set", "priorityClassName=", "--set", "clusterNetwork=global-router",
        "--set", "nodeSelector.role=rdma", "--set", "updateStrategy.rollingUpdate.maxUnavailable=2",
        "--set", "resources.devicePlugin.limits.cpu=100m",
    )) if d["kind"] == "DaemonSet"]  # fmt: skip
    assert conf.schema_problems(ds) == []
    spec = ds["spec"]["template"]["spec"]
    images = {c["image"] for c in [*spec["initContainers"], *spec["containers"]]}
    assert images == {"registry.example/rdma-cni:0.1.1"}
    assert "priorityClassName" not in spec
    assert spec["nodeSelector"] == {conf.RDMA_LABEL: "true", "role": "rdma"}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 2
    assert conf._container(ds, "rdma-device-plugin")["resources"]["limits"]["cpu"] == "100m"
    init = spec["initContainers"][0]
    assert {e["name"]: e["value"] for e in init["env"]}["CLUSTER_MODE"] == "global-router"


def test_one_template_per_kind_of_object() -> None:
    kinds: dict[str, set[str]] = {}
    for sets in ([], ["--set", "frontEnd=dra", "--set", "metrics.serviceMonitor.enabled=true",
                      "--set", "metrics.prometheusRule.enabled=true"]):
        for d in re.split(r"^---\n", chart.template(*sets), flags=re.MULTILINE):
            source = re.search(r"^# Source: rdma-cni/templates/(\S+)", d, re.MULTILINE)
            kind = re.search(r"^kind: (\S+)", d, re.MULTILINE)
            if source and kind:
                kinds.setdefault(kind.group(1), set()).add(source.group(1))
    assert all(len(files) == 1 for files in kinds.values()), kinds
    assert len({f for files in kinds.values() for f in files}) == len(kinds)


def test_the_dra_variant_refuses_its_uninstall_through_a_pre_delete_check_of_held_claims() -> None:
    from rdma_cni.cli.tool import LAZY_COMMANDS

    rendered = docs(chart.template("--set", "frontEnd=dra"))
    hooks = [d for d in rendered if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert {(d["kind"], d["metadata"]["name"]) for d in hooks} == {
        (kind, "rdma-cni-uninstall-check")
        for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job")
    }
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete" for d in hooks)
    (job,) = [d for d in hooks if d["kind"] == "Job"]
    (role,) = [d for d in hooks if d["kind"] == "ClusterRole"]
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hooks}
    assert weights["Job"] > max(w for k, w in weights.items() if k != "Job"), "its rights exist first"
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]}
    ]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rdma-cni-uninstall-check" and job["spec"]["backoffLimit"] == 0
    (c,) = pod["containers"]
    assert c["command"][0] == "/opt/rdma-cni/bundle/cni-tool" and c["command"][1] in LAZY_COMMANDS
    assert "held-claims" not in chart.template("--set", "frontEnd=dra", hooks=False)
    assert "held-claims" not in chart.template()  # the device plugin leaves no pod unable to end
