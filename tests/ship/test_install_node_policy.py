"""install.sh writes the node policy (/etc/rdma-cni/node-policy.json) from its options, as the chart's
``nodePolicy`` values give them: the file the plugins read parses, fixes the node's paths (the conf
dir and kubelet root it was given), and the configs it installed beside it pass it unchanged; bad
options are refused before anything is written; uninstall removes it. The bundle:
``tests/install_support.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import install_support
import pytest
from install_support import install

from rdma_cni import node_policy

pytestmark = pytest.mark.tenant

bundle = install_support.bundle
POLICY = "etc/rdma-cni/node-policy.json"


def read_policy(root: Path) -> node_policy.NodePolicy:
    return node_policy.parse(json.loads((root / POLICY).read_text()), str(root / POLICY))


def test_the_default_install_writes_a_node_policy_its_own_configs_pass(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    proc = install(bundle, root, "--mode", "vpc-cni", "--rdma-mode", "exclusive")
    assert proc.returncode == 0, proc.stderr
    policy = read_policy(root)
    assert policy.enforced and policy.bonds is None and policy.bonds_from == "kubelet"
    assert policy.networks.namespace_isolation and policy.networks.global_namespaces == ("default",)
    assert policy.networks.allowed_types is None and not policy.networks.type_allowed("host-device")
    delegate = json.loads((root / "etc/cni/net.d/rdma-multus.d/tke-rdma-macvlan.conf").read_text())
    assert policy.narrow(delegate, "rdma-macvlan")["dataDir"] == "/var/lib/cni/rdma-macvlan"
    (meta,) = json.loads((root / "etc/cni/net.d/00-rdma-multus.conflist").read_text())["plugins"]
    assert policy.narrow(meta, "rdma-multus")["kubeconfig"] == meta["kubeconfig"]


def test_the_options_reach_the_policy_and_the_node_paths_follow_the_install(
    bundle: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    proc = install(bundle, root, "--mode", "global-router", "--rdma-mode", "shared", "--shared-link",
                   "macvlan",
                   "--conf-dir", "/etc/cni/other.d", "--kubelet-root-dir", "/data/kubelet",
                   "--bonds", "bond0,bond1", "--namespace-isolation", "false",
                   "--global-namespaces", "default,rdma-shared",
                   "--allowed-types", "rdma-macvlan,rdma-ipvlan")
    assert proc.returncode == 0, proc.stderr
    policy = read_policy(root)
    assert policy.bonds == ("bond0", "bond1")
    assert not policy.networks.namespace_isolation
    assert policy.networks.global_namespaces == ("default", "rdma-shared")
    assert policy.networks.allowed_types == ("rdma-macvlan", "rdma-ipvlan")
    assert policy.paths["rdma-macvlan"]["kubeletRootDir"] == "/data/kubelet"
    assert policy.paths["rdma-ipvlan"]["link"] == "macvlan"
    assert policy.paths["rdma-multus"]["confDir"] == "/etc/cni/other.d/rdma-multus.d"
    shared = json.loads((root / "etc/cni/other.d/rdma-multus.d/tke-rdma-ipvlan.conf").read_text())
    assert policy.narrow(shared, "rdma-ipvlan")["link"] == "macvlan"
    (meta,) = json.loads((root / "etc/cni/other.d/00-rdma-multus.conflist").read_text())["plugins"]
    assert policy.narrow(meta, "rdma-multus")["kubeletRootDir"] == "/data/kubelet"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace-isolation", "yes"], "--namespace-isolation must be true or false"),
        (["--bonds", "bond0;rm -rf /"], "--bonds is a comma-separated list"),
        (["--global-namespaces", "a b"], "--global-namespaces is a comma-separated list"),
        (["--allowed-types", "../x"], "--allowed-types is a comma-separated list"),
    ],
)
def test_a_bad_policy_option_is_refused_before_anything_is_written(
    bundle: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    root = tmp_path / "root"
    proc = install(bundle, root, "--mode", "vpc-cni", *args)
    assert proc.returncode != 0 and message in proc.stderr
    assert not root.exists()


def test_uninstall_removes_the_policy(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert install(bundle, root, "--mode", "vpc-cni").returncode == 0
    assert (root / POLICY).exists()
    proc = install(bundle, root, "--uninstall")
    assert proc.returncode == 0, proc.stderr
    assert not (root / POLICY).exists() and not (root / "etc/rdma-cni").exists()


def test_node_policy_option_writes_the_policy_where_it_says(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    proc = install(bundle, root, "--mode", "vpc-cni", "--node-policy", "/srv/demo/policy.json")
    assert proc.returncode == 0, proc.stderr
    assert read_policy_at(root / "srv/demo/policy.json").enforced
    assert not (root / POLICY).exists()
    bad = install(bundle, tmp_path / "bad", "--node-policy", "relative.json")
    assert bad.returncode != 0 and "--node-policy must be an absolute path" in bad.stderr


def read_policy_at(path: Path) -> node_policy.NodePolicy:
    return node_policy.parse(json.loads(path.read_text()), str(path))
