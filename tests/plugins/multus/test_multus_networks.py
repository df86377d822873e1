"""The pod annotation and rdma-multus's own config: every form accepted, every mistake named."""

from __future__ import annotations

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, CniError
from rdma_cni.plugins.multus.config import DEFAULT_ANNOTATION, parse_config
from rdma_cni.plugins.multus.networks import NetworkSelection, parse_annotation


def test_tke_short_form_from_the_guide() -> None:
    assert parse_annotation("tke-route-eni,tke-rdma-macvlan") == [
        NetworkSelection(name="tke-route-eni"),
        NetworkSelection(name="tke-rdma-macvlan"),
    ]


def test_short_form_with_namespace_interface_and_spaces() -> None:
    got = parse_annotation(" kube-system/tke-rdma-macvlan@rdma0 , other ")
    assert got == [
        NetworkSelection(name="tke-rdma-macvlan", namespace="kube-system", interface="rdma0"),
        NetworkSelection(name="other"),
    ]


def test_json_form_with_every_field() -> None:
    text = (
        '[{"name": "tke-rdma-macvlan", "namespace": "default", "interface": "bond0",'
        ' "mac": "02:00:00:00:00:42", "ips": ["198.51.100.5/24"], "deviceID": "mlx5_bond_3",'
        ' "cni-args": {"foo": "bar"}}]'
    )
    (sel,) = parse_annotation(text)
    assert sel == NetworkSelection(
        name="tke-rdma-macvlan",
        namespace="default",
        interface="bond0",
        mac="02:00:00:00:00:42",
        ips=("198.51.100.5/24",),
        device_id="mlx5_bond_3",
        cni_args={"foo": "bar"},
    )


def test_empty_annotation_asks_for_nothing() -> None:
    assert parse_annotation("  ") == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("Tke-Route-Eni", "not a DNS-1123 label"),
        ("../etc/passwd", "not a DNS-1123 label"),
        ("a" * 64, "not a DNS-1123 label"),
        ("/net", "empty namespace"),
        ("Bad_NS/net", "namespace 'Bad_NS'"),
        ("net@", "empty interface"),
        ("net@this-name-is-too-long", "not a valid name"),
        ("a@x,b@x", "requested twice"),
        ('[{"name": 3}]', "'name' must be a string"),
        ('[{"interface": "x"}]', "network name is missing"),
        ('[{"name": "a", "mac": "zz"}]', "not a MAC address"),
        ('[{"name": "a", "ips": "198.51.100.1/24"}]', "'ips' must be a list"),
        ('[{"name": "a"}', "not valid JSON"),
        ('["a"]', "must be a JSON object"),
    ],
)
def test_bad_annotations_are_config_errors_naming_the_entry(text: str, needle: str) -> None:
    with pytest.raises(CniError) as exc:
        parse_annotation(text, DEFAULT_ANNOTATION)
    assert exc.value.code == INVALID_CONFIG
    assert needle in exc.value.msg and DEFAULT_ANNOTATION in exc.value.msg


def test_config_defaults_and_list_forms() -> None:
    cfg = parse_config({"defaultDelegates": "tke-route-eni, tke-bridge", "binDirs": ["/opt/cni/bin"]})
    assert cfg.default_delegates == ("tke-route-eni", "tke-bridge")
    assert cfg.annotation == DEFAULT_ANNOTATION
    assert cfg.kubelet_root_dir == "/var/lib/kubelet"
    assert cfg.delegate_dirs(("/elsewhere",)) == ("/opt/cni/bin",)
    assert parse_config({"defaultDelegates": ["a"]}).delegate_dirs(("/x", "/y")) == ("/x", "/y")
    assert cfg.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert cfg.pod_resources_dir == "/var/lib/kubelet/pod-resources"
    assert cfg.rdma_resource == "tke.cloud.tencent.com/tke-shared-rdma" and cfg.pod_resources_timeout == 3.0


def test_kubelet_dirs_follow_the_root_unless_each_is_set() -> None:
    moved = parse_config({"defaultDelegates": "a", "kubeletRootDir": "/data/kubelet"})
    assert (moved.device_plugin_dir, moved.pod_resources_dir) == (
        "/data/kubelet/device-plugins", "/data/kubelet/pod-resources",
    )  # fmt: skip
    # kubelet --root-dir=/data/kubelet: pod-resources moves, device-plugins stays (a constant in kubelet)
    real = parse_config({"defaultDelegates": "a", "kubeletRootDir": "/data/kubelet",
                         "devicePluginDir": "/var/lib/kubelet/device-plugins"})  # fmt: skip
    assert (real.device_plugin_dir, real.pod_resources_dir) == (
        "/var/lib/kubelet/device-plugins", "/data/kubelet/pod-resources",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({}, "'defaultDelegates' is missing"),
        ({"defaultDelegates": 5}, "'defaultDelegates' must be"),
        ({"defaultDelegates": "a", "confDir": "relative"}, "'confDir' must be an absolute path"),
        ({"defaultDelegates": "a", "kubeconfig": 1}, "'kubeconfig' must be a string"),
        ({"defaultDelegates": "a", "binDirs": "/opt"}, "'binDirs' must be a list"),
        ({"defaultDelegates": "a", "apiTimeoutSeconds": 0}, "'apiTimeoutSeconds' must be greater than 0"),
        ({"defaultDelegates": "a", "apiAttempts": 1.5}, "'apiAttempts' must be a positive integer"),
        ({"defaultDelegates": "a", "delegateTimeoutSeconds": True}, "'delegateTimeoutSeconds' must be"),
        ({"defaultDelegates": "a", "devicePluginDir": "dp"}, "'devicePluginDir' must be an absolute path"),
        ({"defaultDelegates": "a", "podResourcesDir": 3}, "'podResourcesDir' must be a string"),
        ({"defaultDelegates": "a", "podResourcesTimeoutSeconds": -1}, "'podResourcesTimeoutSeconds' must be"),
        ({"defaultDelegates": "a", "rdmaResourceName": ["x"]}, "'rdmaResourceName' must be a string"),
    ],
)
def test_bad_config_names_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(CniError) as exc:
        parse_config(raw)
    assert exc.value.code == INVALID_CONFIG and key in exc.value.msg
