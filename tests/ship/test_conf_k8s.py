"""The Kubernetes manifests of conf/k8s: a schema check against the API's own models, plus the seed's
parameters. The models are the kubernetes client's (pydantic, unknown fields forbidden, types and
required fields checked). kubectl's --dry-run=client would be the other way, but it downloads the
schema from an API server, which a test here cannot have.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "conf" / "k8s"
MODES = {"global-router": "tke-bridge", "vpc-cni": "tke-route-eni"}
RDMA_LABEL = "feature.node.kubernetes.io/tke-shared-rdma"
RDMA_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"

# kubernetes >= 37: its API models are pydantic (extra fields forbidden), which is what the check uses.
pytest.importorskip("kubernetes", minversion="37", reason="schema check needs the kubernetes client >= 37")
kube_client = pytest.importorskip("kubernetes.client")
yaml = pytest.importorskip("yaml")

API_GROUPS = {
    "ServiceAccount": "v1",
    "Pod": "v1",
    "ConfigMap": "v1",
    "DaemonSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "DeviceClass": "resource.k8s.io/v1",
    "ResourceClaim": "resource.k8s.io/v1",
    "ResourceClaimTemplate": "resource.k8s.io/v1",
    "ValidatingAdmissionPolicy": "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io/v1",
}
Mutation = Callable[[dict[str, Any]], object]
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def manifests() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def schema_problems(doc: dict[str, Any]) -> list[str]:
    kind = doc.get("kind", "")
    if API_GROUPS.get(kind) != doc.get("apiVersion"):
        return [f"{kind}: apiVersion {doc.get('apiVersion')!r}, expected {API_GROUPS.get(kind)!r}"]
    model = getattr(kube_client, f"V1{kind}")
    try:
        model.model_validate(doc)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError lists every problem
        return [f"{kind}: {exc}"]
    problems = []
    for path, value in _walk(doc):
        if re.search(r"resources\.(limits|requests)\.[^.]+$", path) and not QUANTITY.match(str(value)):
            problems.append(f"{path}: {value!r} is not a resource quantity")
    return problems


def _walk(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in _walk(v, f"{prefix}.{k}" if prefix else k)]
    if isinstance(node, list):
        return [pair for i, v in enumerate(node) for pair in _walk(v, f"{prefix}[{i}]")]
    return [(prefix, node)]


def test_every_manifest_passes_the_schema_check() -> None:
    files = manifests()
    assert {p.name for p in files} >= {"rdma-cni.yaml", "ibv-app.yaml", "nccl-test.yaml", "rdma-pod.yaml"}
    for path in files:
        for doc in documents(path):
            assert schema_problems(doc) == [], path


def test_schema_check_catches_typos_types_and_missing_fields() -> None:
    ds = next(d for d in documents(K8S / "rdma-cni.yaml") if d["kind"] == "DaemonSet")
    container = ["spec", "template", "spec", "containers", 0]
    mutations: list[Mutation] = [
        lambda d: _at(d, container).update(imagee="x"),  # unknown field
        lambda d: _at(d, container).pop("name"),  # required field
        lambda d: _at(d, ["spec", "template", "spec"]).update(hostNetwork="yes"),  # wrong type
        lambda d: _at(d, [*container, "resources", "limits"]).update(cpu="fifty"),  # bad quantity
        lambda d: d.update(apiVersion="extensions/v1beta1"),
    ]
    for mutate in mutations:
        bad = copy.deepcopy(ds)
        mutate(bad)
        assert schema_problems(bad), bad


def _at(doc: Any, path: list[Any]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _daemonset() -> dict[str, Any]:
    return next(d for d in documents(K8S / "rdma-cni.yaml") if d["kind"] == "DaemonSet")


def test_daemonset_carries_the_tke_guides_component_parameters() -> None:
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {RDMA_LABEL: "true"}
    seed = {"requests": {"cpu": "10m", "memory": "100Mi"}, "limits": {"cpu": "50m", "memory": "500Mi"}}
    for c in pod["containers"] + pod["initContainers"]:
        if c["name"] == "rdma-agent":
            # The seed's, but for the CPU limit: 50m throttles every warm CNI call (measured ADD p50
            # 1020 ms at 50m vs 59 ms at 1 CPU; cold in-process 390 ms), see the manifest.
            assert c["resources"] == {**seed, "limits": {**seed["limits"], "cpu": "500m"}}
        else:  # refresh too, since its readiness is the installer's check, not the doctor
            assert c["resources"] == seed, c["name"]
    # The containers that run install.sh carry the installer's parameters.
    for c in [_container(ds, "refresh"), *pod["initContainers"]]:
        env = {e["name"]: e["value"] for e in c.get("env", [])}
        assert env["KUBELET_ROOT_DIR"] == "/var/lib/kubelet"
        assert env["CLUSTER_MODE"] in MODES
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["kubelet-root"] == "/var/lib/kubelet"
    assert host_paths["cni-bin"] == "/opt/cni/bin" and host_paths["cni-conf"] == "/etc/cni/net.d"
    install = pod["initContainers"][0]
    assert install["command"] == ["/opt/rdma-cni/install.sh"]
    args = install["args"]
    assert args[args.index("--host-root") + 1] == "/host"  # configs must name node paths
    assert args[args.index("--mode") + 1] == "$(CLUSTER_MODE)"
    assert args[args.index("--kubelet-root-dir") + 1] == "$(KUBELET_ROOT_DIR)"


def test_rbac_grants_exactly_what_the_meta_plugin_calls() -> None:
    docs = {d["kind"]: d for d in documents(K8S / "rdma-cni.yaml")}
    sa = docs["ServiceAccount"]["metadata"]
    assert docs["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},  # the pod's annotation
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},  # network-status
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"], "verbs": ["get"]},
    ]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    assert binding["subjects"] == [subject]


def _workload_pods() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for path in sorted((K8S / "examples").glob("*.yaml")):
        for doc in documents(path):
            template = doc if doc["kind"] == "Pod" else doc["spec"]["template"]
            out.append((path.name, template["metadata"], template["spec"]))
    return out


def test_example_workloads_ask_for_the_rdma_plane_as_the_seed_does() -> None:
    pods = _workload_pods()
    assert len(pods) == 3
    networks = {f"{default},tke-rdma-macvlan" for default in MODES.values()}
    for name, meta, spec in pods:
        assert meta["annotations"][ANNOTATION] in networks, name
        for c in spec["containers"]:
            assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"], name
            assert int(c["resources"]["limits"][RDMA_RESOURCE]) >= 1, name
            gpus = c["resources"]["limits"].get("nvidia.com/gpu")
            assert gpus is None or gpus == c["resources"]["limits"][RDMA_RESOURCE], name
        assert spec["nodeSelector"] == {RDMA_LABEL: "true"}, name


# ---- rdma-agent, the warm node daemon --------------------------------------------------------------


def _container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name
    ]
    assert len(found) == 1, f"expected one container named {name}"
    return found[0]


def _host_mounts(ds: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> {hostPath, readOnly, mountPropagation} of a container's hostPath mounts (not the
    pod's own emptyDir, which is no node path)."""
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    out = {}
    for m in container["volumeMounts"]:
        assert "subPath" not in m, m
        if "hostPath" not in volumes[m["name"]]:
            assert set(volumes[m["name"]]) == {"name", "emptyDir"}, volumes[m["name"]]
            continue
        out[m["mountPath"]] = {
            "hostPath": volumes[m["name"]]["hostPath"]["path"],
            "readOnly": bool(m.get("readOnly", False)),
            "mountPropagation": m.get("mountPropagation"),
        }
    return out


def _under(path: str, mounts: dict[str, dict[str, Any]], writable: bool = False) -> str | None:
    """The mount that shows ``path`` inside the container (writable if asked), or None."""
    for mount, m in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return mount if not (writable and m["readOnly"]) else None
    return None


def test_agent_runs_the_nodes_installed_bundle_with_real_flags() -> None:
    from rdma_cni.agent import client
    from rdma_cni.cli.agent import parse_args

    ds = _daemonset()
    agent = _container(ds, "rdma-agent")
    mounts = _host_mounts(ds, agent)
    # The node's own install (a worker refuses a call whose mount namespace shows other code at the
    # agent's paths), run as the multicall bundle's rdma-agent command.
    assert agent["command"] == ["/opt/cni/bin/rdma-cni.d/current/rdma-cni", "rdma-agent"]
    assert _under(agent["command"][0], mounts) == "/opt/cni/bin"
    args = parse_args(agent["args"])  # argparse exits on a flag rdma-agent does not have
    # The socket every plugin's client connects to by default (Python and C clients alike).
    c_default = re.search(r'#define DEFAULT_SOCKET "([^"]+)"', (REPO / "rdma_cni/agent/client.c").read_text())
    assert c_default is not None
    assert args.socket == client.DEFAULT_SOCKET == c_default.group(1)
    assert _under(os.path.dirname(args.socket), mounts, writable=True) == "/run/rdma-cni"
    assert args.conf_dir == "/etc/cni/net.d" and _under(args.conf_dir, mounts) == args.conf_dir
    assert args.cni_path == "/opt/cni/bin" and _under(args.cni_path, mounts) == args.cni_path
    assert args.reconcile_interval == 60
    assert not args.probe
    # Readiness: the protocol end to end through the same socket, by the C client of the same
    # bundle, whose probe takes rdma-agent --probe's options (tests/agent/test_agent.py runs both).
    probe = agent["readinessProbe"]["exec"]["command"]
    assert probe[0] == os.path.join(os.path.dirname(agent["command"][0]), "rdma-cni-client")
    assert probe[1] == "--probe"
    probe_args = parse_args(probe[1:])
    assert probe_args.probe and probe_args.socket == args.socket
    # kubelet kills a probe at its timeout: the wait for a starting agent plus one probe fit inside
    assert agent["readinessProbe"]["timeoutSeconds"] > probe_args.probe_wait + probe_args.probe_timeout
    assert probe_args.probe_wait > 0 and agent["readinessProbe"]["initialDelaySeconds"] == 0


def _readiness(ds: dict[str, Any], host: Path, status: str | None) -> subprocess.CompletedProcess[str]:
    """The refresh container's readiness command run with the source tree's scripts/install.sh on a
    temp host root (its /host), the device plugin's status file (a node path) written as ``status``."""
    argv = _container(ds, "refresh")["readinessProbe"]["exec"]["command"]
    assert argv[:2] == ["/opt/rdma-cni/install.sh", "--check"]
    args = [str(host) if a == "/host" else a for a in argv[1:]]
    args[args.index("--wait") + 1] = "0"
    dp_status = args[args.index("--device-plugin-status") + 1]
    if status is not None:
        (host / dp_status.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (host / dp_status.lstrip("/")).write_text(status)
    return subprocess.run(["sh", str(REPO / "scripts/install.sh"), *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_refresh_readiness_is_the_installers_check_waiting_for_a_starting_node_inside_its_timeout(
    tmp_path: Path,
) -> None:
    """Ready once the install container's work is in place and the device plugin is registered; not
    ready, naming what is missing, when a config goes or the plugin is not registered. As the pod
    starts (no initial delay), looking again while the device plugin beside it starts."""
    ds = _daemonset()
    probe = _container(ds, "refresh")["readinessProbe"]
    argv = probe["exec"]["command"]
    assert probe["initialDelaySeconds"] == 0 and int(argv[argv.index("--wait") + 1]) > 0
    wait = int(argv[argv.index("--wait") + 1])
    assert probe["timeoutSeconds"] > wait + 10, "a last check fits after the wait"
    host = _install_node(ds, tmp_path, "exclusive")
    # what --kubeconfig-from-serviceaccount writes in the DaemonSet (tests/ship/test_install.py runs it)
    kubeconfig = host / "etc/cni/net.d/rdma-multus.d/rdma-multus.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    registered = '{"pools":[{"registered":true}],"registered":true}'
    assert _readiness(ds, host, registered).returncode == 0
    not_yet = _readiness(ds, host, '{"pools":[{"registered":false}],"registered":false}')
    assert not_yet.returncode == 1 and "not registered with kubelet" in not_yet.stderr
    (host / "etc/cni/net.d/00-rdma-multus.conflist").unlink()  # someone's cleanup, or a half-done uninstall
    gone = _readiness(ds, host, registered)
    assert gone.returncode == 1 and "00-rdma-multus.conflist is missing" in gone.stderr, gone.stderr


def test_agent_serves_metrics_on_the_port_the_annotations_point_at_and_declares_no_host_port() -> None:
    from rdma_cni.agent.metrics.address import listen
    from rdma_cni.cli.agent import parse_args

    ds = _daemonset()
    agent = _container(ds, "rdma-agent")
    args = parse_args(agent["args"])
    host, _, port = args.metrics_address.rpartition(":")
    assert host == "0.0.0.0"  # hostNetwork: the node's addresses, where Prometheus reaches it
    # hostNetwork makes every declared port a hostPort, which would keep a node's surge pod from
    # being scheduled beside the old one: no container declares one
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert [c["name"] for c in spec["containers"] + spec["initContainers"] if c.get("ports")] == []
    notes = ds["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == port and notes["prometheus.io/path"] == "/metrics"
    with pytest.raises(ValueError, match="--metrics-address"):
        listen(args.metrics_address.replace(port, "0"))


def test_agent_mounts_are_the_node_paths_it_and_its_workers_use() -> None:
    from rdma_cni.plugins.macvlan.config import parse_config

    ds = _daemonset()
    mounts = _host_mounts(ds, _container(ds, "rdma-agent"))
    for path, m in mounts.items():
        assert m["hostPath"] == path, f"{path} shows node path {m['hostPath']}: not the same path"
    assert set(mounts) == {
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/var/lib/cni",
        "/run/rdma-cni",
        "/var/run/netns",
        "/sys",
    }
    # Reconcile runs rdma-macvlan's DEL in the container: the shipped delegate's state and run dirs
    # must be writable there, its sysfs readable.
    conf = json.loads((REPO / "conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    cfg = parse_config(conf)
    assert _under(cfg.data_dir, mounts, writable=True) == "/var/lib/cni"
    assert _under(cfg.run_dir, mounts, writable=True) == "/run/rdma-cni"
    assert _under(cfg.sysfs_root, mounts) == "/sys"
    # Pod netns created after the agent started must appear in it, or reconcile sees nothing.
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"


def test_agent_is_privileged_on_the_nodes_network_and_pids() -> None:
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    agent = _container(ds, "rdma-agent")
    assert agent["securityContext"] == {"privileged": True}  # setns(2) needs CAP_SYS_ADMIN
    assert pod["hostNetwork"] is True
    assert pod["hostPID"] is True  # workers use the node's /proc after joining its mount namespace
    assert {c["name"] for c in pod["containers"]} == {"rdma-agent", "refresh", "rdma-device-plugin"}
    # The agent runs what the init container installed: it must come after it, never instead.
    assert [c["name"] for c in pod["initContainers"]] == ["install"]


def test_schema_check_catches_a_bad_agent_container() -> None:
    ds = _daemonset()
    index = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]].index("rdma-agent")
    agent = ["spec", "template", "spec", "containers", index]
    mutations: list[Mutation] = [
        lambda d: _at(d, [*agent, "securityContext"]).update(privileged="very"),
        lambda d: _at(d, [*agent, "volumeMounts", 0]).pop("mountPath"),
        lambda d: _at(d, [*agent, "readinessProbe"]).update(exec={"cmd": ["x"]}),
        lambda d: _at(d, ["spec", "template", "spec"]).update(hostPid=True),
    ]
    for mutate in mutations:
        bad = copy.deepcopy(ds)
        mutate(bad)
        assert schema_problems(bad), bad


def test_refresh_doctor_sees_every_node_path_it_reads_at_that_path() -> None:
    """The doctor (run in the refresh container, as the chart's troubleshooting note says) reads the
    caches and records the installed configs name by node path:
    without them it warned on a healthy node ("held by container X whose pod is not recorded" for
    every held bond, "GID record ... has no attachment" for every shared pod)."""
    from rdma_cni.doctor.node import NodePaths

    ds = _daemonset()
    mounts = _host_mounts(ds, _container(ds, "refresh"))
    records = ["/var/lib/cni/rdma-macvlan", "/var/lib/cni/rdma-ipvlan", "/run/rdma-cni"]
    wanted = [*NodePaths().results_dirs, *records]
    for path in wanted:
        mount = _under(path, mounts)
        assert mount is not None, f"refresh does not see {path}"
        assert mounts[mount]["hostPath"] == mount, f"{path} is not the node's {path} in refresh"


def test_device_plugin_writes_npwg_device_info_where_upstream_multus_reads_it() -> None:
    ds = _daemonset()
    mounts = _host_mounts(ds, _container(ds, "rdma-device-plugin"))
    mount = _under("/var/run/k8s.cni.cncf.io/devinfo/dp/x.json", mounts, writable=True)
    assert mount == "/var/run/k8s.cni.cncf.io" and mounts[mount]["hostPath"] == "/run/k8s.cni.cncf.io"


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """kubelet's $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_device_plugin_runs_in_its_own_container_with_directory_mounts(tmp_path: Path) -> None:
    from rdma_cni.cli.device_plugin import flags_of, parse_args
    from rdma_cni.deviceplugin.status import status_path
    from rdma_cni.devices.config import PluginConfig

    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    dp = _container(ds, "rdma-device-plugin")
    # Not in rdma-agent's process (gRPC threads and forked workers do not mix): its own container,
    # running the node's installed bundle like the agent (shared pages), from the node's path.
    agent = _container(ds, "rdma-agent")
    assert dp["command"] == [agent["command"][0], "rdma-device-plugin"]
    assert "rdma-device-plugin" not in " ".join(agent["command"] + agent["args"])
    env = {e["name"]: e["value"] for e in dp["env"]}
    assert env["KUBELET_ROOT_DIR"] == "/var/lib/kubelet"
    flags = flags_of(parse_args(_expand(dp["args"], env)))  # argparse exits on a flag it does not have
    # The config it would run with (the node's rdma-macvlan config is not here: its defaults).
    cfg = PluginConfig(**{k: v for k, v in flags.items() if k not in ("log_file", "log_level")})
    mounts = _host_mounts(ds, dp)
    assert _under(dp["command"][0], mounts) == "/opt/cni/bin"
    # kubelet's socket directories are mounted as directories at their node paths, never socket files.
    assert cfg.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert cfg.pod_resources_dir == env["KUBELET_ROOT_DIR"] + "/pod-resources"
    for path in (cfg.device_plugin_dir, cfg.pod_resources_dir):
        assert mounts[path]["hostPath"] == path and not path.endswith(".sock")
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes["device-plugins"]["type"] == volumes["pod-resources"]["type"] == "DirectoryOrCreate"
    assert _under(cfg.device_plugin_dir + "/x.sock", mounts, writable=True) == cfg.device_plugin_dir
    # What it reads and writes (defaults of the shipped rdma-macvlan config: dataDir, runDir).
    conf = json.loads((REPO / "conf/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    # The delegate config it follows comes from the config file the install container writes
    # (RDMA_MODE exclusive: tke-rdma-macvlan's), not from a flag that would win over that file.
    assert "cni_conf" not in flags
    installed = _node_device_plugin_config(ds, _install_node(ds, tmp_path, "exclusive"))
    assert installed["cniConf"] == "/etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf"
    assert _under(installed["cniConf"], mounts) == "/etc/cni/net.d"
    run_dir = conf.get("runDir", cfg.run_dir)
    assert _under(status_path(run_dir), mounts, writable=True) == "/run/rdma-cni"
    assert _under(conf.get("dataDir", cfg.data_dir) + "/attachments", mounts) is not None
    assert _under(cfg.sysfs_root, mounts) == "/sys" and mounts["/sys"]["hostPath"] == "/sys"
    # Device specs name host paths = container paths under /dev: the node's /dev must be there.
    assert cfg.dev_root == "/dev" and mounts["/dev"]["hostPath"] == "/dev"
    assert flags["log_file"] == ""  # stderr: kubectl logs; the root filesystem is read-only
    assert dp["securityContext"]["readOnlyRootFilesystem"] is True
    assert dp["securityContext"]["privileged"] is False


# ---- the device plugin's commented variants: shared mode, and Mellanox's config.json -------------------


def _variant(mark: str) -> list[dict[str, Any]]:
    """rdma-cni.yaml with the ``#<mark># `` marks removed: the variant as a user switches it on."""
    text = re.sub(rf"^(\s*)#{mark}# ", r"\1", (K8S / "rdma-cni.yaml").read_text(), flags=re.MULTILINE)
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.mark.parametrize("mark", ["mellanox"])
def test_device_plugin_variants_are_valid_manifests_whose_config_loads(mark: str, tmp_path: Path) -> None:
    import sys

    from rdma_cni.cli.device_plugin import flags_of, parse_args
    from rdma_cni.devices.config import load_config

    sys.path.insert(0, str(REPO / "tests"))
    import seed002

    ds = _checked_daemonset(_variant(mark))
    dp = _container(ds, "rdma-device-plugin")
    args = parse_args(_expand(dp["args"], {e["name"]: e["value"] for e in dp["env"]}))
    mounts = {m["mountPath"]: m["name"] for m in dp["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    directory = os.path.dirname(args.config)
    config_map = volumes[mounts[directory]]["configMap"]["name"]
    assert (config_map, args.config) == ("rdma-devices", seed002.MOUNT_PATH)  # the seed's ConfigMap
    text = seed002.config_text()
    want = [("rdma/hca_shared_devices_a", "shared", 200)]
    (tmp_path / "sys").mkdir()
    (tmp_path / "dev").mkdir()
    path = tmp_path / os.path.basename(args.config)
    path.write_text(text)
    flags = {
        **flags_of(args),
        "sysfs_root": str(tmp_path / "sys"),
        "dev_root": str(tmp_path / "dev"),
        "cni_conf": str(tmp_path / "absent.conf"),
    }
    cfg = load_config(flags, str(path))
    assert [(s.resource_name, s.mode, s.count) for s in cfg.pool_specs()] == want


# ---- the RDMA mode switch: env RDMA_MODE -> install.sh --rdma-mode -> the device plugin's config -------


def _with_rdma_mode(value: str) -> list[dict[str, Any]]:
    """rdma-cni.yaml with RDMA_MODE set to ``value`` everywhere it is set: the one edit a user makes."""
    text = (K8S / "rdma-cni.yaml").read_text()
    text, n = re.subn(r"(- name: RDMA_MODE\n\s+value: )exclusive\b", rf"\g<1>{value}", text)
    assert n == 2, "RDMA_MODE is set in the install and the refresh container"
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _install_node(ds: dict[str, Any], tmp_path: Path, rdma_mode: str) -> Path:
    """The install container's command (its args, $(VAR) expanded from its env) run with the source
    tree's scripts/install.sh into a temp host root. The bundle is a stand-in with the repo's conf/:
    test_install.py and test_install_rdma_mode.py (beside this file) run the built one; this file checks what
    the manifest makes of it."""
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["RDMA_MODE"] == rdma_mode
    bundle = tmp_path / f"bundle-{rdma_mode}"
    bundle.mkdir()
    (bundle / "rdma-cni").write_text("#!/bin/sh\nexit 1\n")
    (bundle / "rdma-cni").chmod(0o755)
    (bundle / "BUILD_ID").write_text("0.0.0-manifest-test\n")
    shutil.copytree(REPO / "conf", bundle / "conf")
    host = tmp_path / f"host-{rdma_mode}"
    swap = {"/opt/rdma-cni/bundle": str(bundle), "/host": str(host)}
    args = [swap.get(a, a) for a in _expand(init["args"], env) if a != "--kubeconfig-from-serviceaccount"]
    proc = subprocess.run(
        ["sh", str(REPO / "scripts/install.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return host


def _node_device_plugin_config(ds: dict[str, Any], host: Path) -> dict[str, Any]:
    """The file the device plugin's --config names, read on the node through its mount."""
    from rdma_cni.cli.device_plugin import parse_args

    dp = _container(ds, "rdma-device-plugin")
    args = parse_args(_expand(dp["args"], {e["name"]: e["value"] for e in dp["env"]}))
    mounts = _host_mounts(ds, dp)
    mount = _under(args.config, mounts)
    assert mount is not None, f"{args.config} is not mounted in the device plugin's container"
    node_path = mounts[mount]["hostPath"] + args.config[len(mount) :]
    # The install container writes it where the node's hostPath shows it (through its /host mount).
    init = ds["spec"]["template"]["spec"]["initContainers"][0]
    assert _under("/host" + node_path, _host_mounts(ds, init), writable=True) is not None
    loaded: dict[str, Any] = yaml.safe_load((host / node_path.lstrip("/")).read_text())
    loaded["_path"] = str(host / node_path.lstrip("/"))
    return loaded


def _checked_daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The variant's DaemonSet, after every document of it passed the schema check and the node
    selector kept TKE's label."""
    for doc in docs:
        assert schema_problems(doc) == [], doc.get("kind")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {RDMA_LABEL: "true"}  # TKE's label kept
    return ds


@pytest.mark.parametrize(
    ("rdma_mode", "delegate", "want"),
    [
        ("exclusive", "tke-rdma-macvlan", ("exclusive", "/var/lib/cni/rdma-macvlan")),
        ("shared", "tke-rdma-ipvlan", ("shared", "/var/lib/cni/rdma-ipvlan")),
    ],
)
def test_rdma_mode_switch_reaches_the_installer_and_the_device_plugin(
    rdma_mode: str, delegate: str, want: tuple[str, str], tmp_path: Path
) -> None:
    from rdma_cni.cli.device_plugin import flags_of, parse_args
    from rdma_cni.devices.config import load_config

    ds = _checked_daemonset(_with_rdma_mode(rdma_mode))
    refresh = _container(ds, "refresh")
    assert {e["name"]: e["value"] for e in refresh["env"]}["RDMA_MODE"] == rdma_mode
    assert '--rdma-mode "$RDMA_MODE"' in refresh["args"][0]
    host = _install_node(ds, tmp_path, rdma_mode)
    installed = _node_device_plugin_config(ds, host)
    assert installed["cniConf"] == f"/etc/cni/net.d/rdma-multus.d/{delegate}.conf"
    assert (host / installed["cniConf"].lstrip("/")).is_file()
    shared_delegate = host / "etc/cni/net.d/rdma-multus.d/tke-rdma-ipvlan.conf"
    assert shared_delegate.is_file() == (rdma_mode == "shared")
    # What the device plugin's process would run with: its args, that file, the installed delegate.
    dp = _container(ds, "rdma-device-plugin")
    args = parse_args(_expand(dp["args"], {e["name"]: e["value"] for e in dp["env"]}))
    (tmp_path / "sys").mkdir()
    (tmp_path / "dev").mkdir()
    flags = {
        **flags_of(args),
        "sysfs_root": str(tmp_path / "sys"),
        "dev_root": str(tmp_path / "dev"),
        "cni_conf": str(host / installed["cniConf"].lstrip("/")),
    }
    cfg = load_config(flags, installed["_path"])
    count = 1000 if rdma_mode == "shared" else None
    specs = [(s.resource_name, s.mode, s.count if s.mode == "shared" else None) for s in cfg.pool_specs()]
    assert specs == [(RDMA_RESOURCE, want[0], count)]
    # It follows the delegate's dataDir (who holds what), which its container mounts at that path.
    assert cfg.data_dir == want[1]
    assert _under(cfg.data_dir + "/attachments", _host_mounts(ds, dp)) is not None


def _example_commands() -> list[tuple[str, list[str]]]:
    """(file:container, command + args) of every container of the examples, as its PID 1 runs."""
    out = []
    for path in sorted((K8S / "examples").rglob("*.yaml")) + sorted(
        (K8S / "dra" / "examples").glob("*.yaml")
    ):
        for doc in documents(path):
            spec = doc.get("spec", {})
            spec = spec.get("template", {}).get("spec", spec)
            for c in spec.get("containers", []) if isinstance(spec, dict) else []:
                if c.get("command"):
                    out.append((f"{path.relative_to(K8S)}:{c['name']}", [*c["command"], *c.get("args", [])]))
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.netns
@pytest.mark.parametrize(("where", "argv"), _example_commands(), ids=[w for w, _ in _example_commands()])
def test_every_example_ends_at_once_when_its_pod_is_deleted(where: str, argv: list[str]) -> None:
    """kubelet stops a container with SIGTERM to its PID 1, which the kernel shields from signals it
    does not handle: an example whose PID 1 ignores it holds every delete for the grace period (the
    DRA examples' `sleep infinity` did, 30 s each). Run as PID 1 of a PID namespace, it must end."""
    import signal
    import time

    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid1,) = _children(proc.pid)
        time.sleep(0.5)  # past its start: the trap or handler is set
        os.kill(pid1, signal.SIGTERM)
        proc.wait(timeout=3)
    finally:
        proc.kill()
        proc.wait()


def test_shared_mode_example_reads_its_gid_index_from_the_network_status_annotation() -> None:
    (doc,) = list(documents(K8S / "examples" / "shared-mode" / "nccl-gid-from-network-status.yaml"))
    assert doc["metadata"]["annotations"][ANNOTATION].endswith(",tke-rdma-ipvlan")
    (container,) = doc["spec"]["containers"]
    assert int(container["resources"]["limits"][RDMA_RESOURCE]) == 1
    (volume,) = doc["spec"]["volumes"]
    (item,) = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations['k8s.v1.cni.cncf.io/network-status']"
    script = container["command"][2]
    compile(script, "entrypoint", "exec")  # the entrypoint is valid Python
    assert '"gid-index"' in script and "NCCL_IB_GID_INDEX" in script
