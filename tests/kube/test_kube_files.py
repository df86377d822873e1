"""kubeconfig YAML reading and the kubelet device checkpoint, on files shaped like the real ones."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, STATE_CORRUPT, CniError
from rdma_cni.kube import kubeconfig
from rdma_cni.kube.checkpoint import pod_devices

# What kubeadm writes for a node (values shortened), with comments and quoting variants added.
KUBEADM_STYLE = """\
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://198.51.100.10:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    namespace: "kube-system"   # quoted scalar with a comment
    user: 'system:node:h5'
  name: system:node:h5@kubernetes
current-context: system:node:h5@kubernetes
kind: Config
preferences: {{}}
users:
- name: system:node:h5
  user:
    client-certificate: pki/client.crt
    client-key: pki/client.key
"""


def test_kubeadm_style_kubeconfig_resolves_relative_files(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "client.crt").write_bytes(b"CERT")
    (tmp_path / "pki" / "client.key").write_bytes(b"KEY")
    path = tmp_path / "kubelet.conf"
    path.write_text(KUBEADM_STYLE.format(ca=base64.b64encode(b"CA-PEM").decode()))
    cfg = kubeconfig.load(str(path))
    assert cfg.server == "https://198.51.100.10:6443"
    assert cfg.ca_data == b"CA-PEM"
    assert (cfg.cert_data, cfg.key_data) == (b"CERT", b"KEY")
    assert cfg.token == "" and not cfg.insecure


def test_kubeconfig_with_block_scalars_and_anchors_is_read_as_yaml(tmp_path: Path) -> None:
    # What a hand-written subset could not read: a folded token, an anchor reused by a second user.
    path = tmp_path / "kubeconfig"
    path.write_text(
        "clusters:\n- name: c\n  cluster:\n    server: https://198.51.100.10:6443\n"
        "    insecure-skip-tls-verify: true\n"
        "users:\n- name: u\n  user: &creds\n    token: >-\n      abc\n      def\n"
        "- name: v\n  user: *creds\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: v}\ncurrent-context: x\n"
    )
    cfg = kubeconfig.load(str(path))
    assert cfg.token == "abc def" and cfg.insecure


def test_malformed_kubeconfig_names_the_file_and_the_place(tmp_path: Path) -> None:
    path = tmp_path / "broken.kubeconfig"
    path.write_text("clusters:\n- name: c\n  cluster: [unclosed\n")
    with pytest.raises(CniError) as info:
        kubeconfig.load(str(path))
    assert info.value.code == INVALID_CONFIG
    assert str(path) in info.value.msg and "not readable YAML" in info.value.msg and "line" in info.value.msg


def test_json_kubeconfig_is_accepted(tmp_path: Path) -> None:
    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "u", "user": {"token": "secret-abc"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kc.json"
    path.write_text(json.dumps(doc))
    cfg = kubeconfig.load(str(path))  # the only context is used without current-context
    assert cfg.insecure and cfg.bearer_token() == "secret-abc"
    assert "secret-abc" not in repr(cfg)


def write_checkpoint(root: Path, entries: list[dict[str, object]]) -> None:
    path = root / "device-plugins" / "kubelet_internal_checkpoint"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"r": ["0", "1"]}}, "Checksum": 1234}
    path.write_text(json.dumps(doc))


def test_checkpoint_numa_map_and_legacy_list_forms(tmp_path: Path) -> None:
    res = "tke.cloud.tencent.com/tke-shared-rdma"

    def entry(uid: str, ctr: str, resource: str, ids: object) -> dict[str, object]:
        return {
            "PodUID": uid,
            "ContainerName": ctr,
            "ResourceName": resource,
            "DeviceIDs": ids,
            "AllocResp": "",
        }

    write_checkpoint(
        tmp_path,
        [
            entry("u1", "a", res, {"1": ["2", "3"], "0": ["0"]}),  # NUMA node -> IDs (kubelet >= 1.20)
            entry("u1", "b", res, ["5"]),  # the older plain list
            entry("u1", "a", "nvidia.com/gpu", {"0": ["GPU-1"]}),
            entry("u2", "a", res, {"0": ["7"]}),
        ],
    )
    dp = str(tmp_path / "device-plugins")
    assert pod_devices(dp, "u1") == {res: ["0", "2", "3", "5"], "nvidia.com/gpu": ["GPU-1"]}
    assert pod_devices(dp, "u2") == {res: ["7"]}
    assert pod_devices(dp, "u3") == {}


def test_checkpoint_absent_is_empty_and_corrupt_is_an_error(tmp_path: Path) -> None:
    assert pod_devices(str(tmp_path / "device-plugins"), "u1") == {}
    path = tmp_path / "device-plugins" / "kubelet_internal_checkpoint"
    path.parent.mkdir(parents=True)
    path.write_text("{torn")
    with pytest.raises(CniError) as exc:
        pod_devices(str(tmp_path / "device-plugins"), "u1")
    assert exc.value.code == STATE_CORRUPT and str(path) in exc.value.msg


def test_exec_credentials_are_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(
        "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n"
        "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n"
        "current-context: x\n"
        "users:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
        "      command: aws\n      args:\n      - eks\n      - get-token\n"
    )
    with pytest.raises(CniError) as exc:
        kubeconfig.load(str(path))
    assert "exec" in exc.value.msg and "tokenFile" in exc.value.msg
