"""The doctor on a node of the DaemonSet's DRA variant, and after a device plugin stopped: the bonds
served by rdma-dra-driver are not a missing device plugin, a device plugin's status left from before a
switch is stale (not "not registered"), and both front ends on one node is said."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from rdma_cni.doctor.deviceplugin import check_device_plugin
from rdma_cni.doctor.findings import FAIL, OK, WARN
from rdma_cni.doctor.plugin_view import DevicePluginView, dra_registration, observe_device_plugin

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def view(status: dict[str, object] | None, dra: str = "", stale: bool = False) -> DevicePluginView:
    return DevicePluginView(
        RESOURCE,
        "/run/rdma-cni/device-plugin/status.json",
        status,
        "" if status else "absent",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        {},
        [],
        "",
        {},
        dra,
        stale,
    )


def test_a_dra_node_is_served_by_the_driver_not_missing_a_device_plugin() -> None:
    (f,) = check_device_plugin(view(None, dra="/var/lib/kubelet/plugins_registry/x-reg.sock"))
    assert f.status == OK and "served through DRA by rdma-dra-driver" in f.detail


def test_a_device_plugins_status_left_from_before_the_switch_is_stale_not_a_failure() -> None:
    st = {"pid": 12625, "registered": True, "devices": []}
    (f,) = check_device_plugin(view(st, dra="/reg.sock", stale=True))
    assert f.status == OK and "pid 12625) is stale" in f.detail


def test_both_front_ends_on_one_node_is_a_warning() -> None:
    st = {"pid": os.getpid(), "registered": True, "devices": []}
    (f,) = check_device_plugin(view(st, dra="/reg.sock"))
    assert f.status == WARN and "both rdma-device-plugin" in f.detail


def test_a_stopped_device_plugin_without_dra_is_not_running() -> None:
    st = {"pid": 4242, "registered": True, "devices": []}
    (f,) = check_device_plugin(view(st, stale=True))
    assert f.status == FAIL and "is not running" in f.detail


def test_observe_finds_the_drivers_socket_and_a_gone_plugin(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # a unix socket path is at most 107 bytes
    try:
        _observe(short / "kubelet", tmp_path)
    finally:
        shutil.rmtree(short)


def _observe(root: Path, tmp_path: Path) -> None:
    (root / "pod-resources").mkdir(parents=True)
    reg = root / "plugins_registry"
    reg.mkdir()
    run = tmp_path / "run"
    (run / "device-plugin").mkdir(parents=True)
    status = run / "device-plugin" / "status.json"
    status.write_text(f'{{"pid": {dead_pid()}, "registered": true, "devices": []}}')
    assert dra_registration(str(root / "pod-resources")) == ""
    v = observe_device_plugin(str(root / "pod-resources"), str(run), RESOURCE)
    assert v.status_stale and v.dra_registration == ""
    path = reg / "rdma.tke.cloud.tencent.com-reg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert dra_registration(str(root / "pod-resources") + "/") == str(path)
        (f,) = check_device_plugin(observe_device_plugin(str(root / "pod-resources"), str(run), RESOURCE))
        assert f.status == OK and "is stale" in f.detail
    status.write_text(f'{{"pid": {os.getpid()}, "registered": true, "devices": []}}')
    assert not observe_device_plugin(str(root / "pod-resources"), str(run), RESOURCE).status_stale
