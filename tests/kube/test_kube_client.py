"""The stdlib Kubernetes client against a real TLS API server on loopback."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_cni.cni.errors import INVALID_CONFIG, KUBE_API_FAILURE, CniError
from rdma_cni.kube import kubeconfig
from rdma_cni.kube.client import PodClient
from tests.kube_server import KubeServer, Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("h5-pki"))


@pytest.fixture
def api(pki: Pki) -> Iterator[KubeServer]:
    with KubeServer(pki) as server:
        server.add_pod(
            "default",
            "ibv-app-0",
            uid="11111111-2222-3333-4444-555555555555",
            annotations={"tke.cloud.tencent.com/networks": "tke-route-eni,tke-rdma-macvlan"},
            limits={"tke.cloud.tencent.com/tke-shared-rdma": "4", "cpu": "500m", "memory": "1Gi"},
        )
        yield server


def client_for(api: KubeServer, tmp_path: Path, auth: str, inline: bool = True, **kw: float) -> PodClient:
    path = api.kubeconfig(tmp_path / "kubeconfig", auth=auth, inline=inline)
    return PodClient(kubeconfig.load(str(path)), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("auth", "inline"),
    [("token", True), ("tokenFile", True), ("cert", True), ("cert", False), ("token", False)],
)
def test_get_pod_with_each_kind_of_credential(
    api: KubeServer, tmp_path: Path, auth: str, inline: bool
) -> None:
    pod = client_for(api, tmp_path, auth, inline).get_pod("default", "ibv-app-0")
    assert pod is not None
    assert pod.uid == "11111111-2222-3333-4444-555555555555"
    assert pod.annotations["tke.cloud.tencent.com/networks"] == "tke-route-eni,tke-rdma-macvlan"
    assert pod.requests == {"tke.cloud.tencent.com/tke-shared-rdma": 4}  # cpu/memory are not device counts
    assert api.requests[-1]["authorization"] is auth.startswith("token")


def test_each_component_names_itself_to_the_api_server(api: KubeServer, tmp_path: Path) -> None:
    """The audit log's userAgent is how the control-plane cost is counted per component."""
    from rdma_cni import __version__
    from rdma_cni.dra.kubeapi import ResourceClient

    path = str(api.kubeconfig(tmp_path / "kubeconfig", auth="token"))
    PodClient(kubeconfig.load(path)).get_pod("default", "ibv-app-0")
    ResourceClient(kubeconfig.load(path)).get_claim("default", "gpu-nic")
    agents = [r["user-agent"] for r in api.requests[-2:]]
    assert agents == [f"rdma-multus/{__version__}", f"rdma-dra-driver/{__version__}"]


def test_missing_pod_is_none_not_an_error(api: KubeServer, tmp_path: Path) -> None:
    assert client_for(api, tmp_path, "token").get_pod("default", "nope") is None


def test_wrong_token_is_refused_without_retry_and_token_is_not_logged(
    api: KubeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = client_for(api, tmp_path, "token")
    api.tokens = {"h5-other-token"}
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CniError) as exc:
        client.get_pod("default", "ibv-app-0")
    assert exc.value.code == KUBE_API_FAILURE and "401" in exc.value.msg
    assert len(api.requests) == 1
    assert client.config.token not in caplog.text and client.config.token not in exc.value.msg
    assert client.config.token not in repr(client.config)


def test_server_errors_are_retried_until_an_answer(api: KubeServer, tmp_path: Path) -> None:
    api.fail_next = [500, 503]
    pod = client_for(api, tmp_path, "token", attempts=3, backoff=0.01).get_pod("default", "ibv-app-0")
    assert pod is not None and len(api.requests) == 3


def test_server_errors_give_up_after_the_attempts(api: KubeServer, tmp_path: Path) -> None:
    api.fail_next = [500] * 10
    with pytest.raises(CniError) as exc:
        client_for(api, tmp_path, "token", attempts=2, backoff=0.01).get_pod("default", "ibv-app-0")
    assert (
        exc.value.code == KUBE_API_FAILURE and "2 attempts" in exc.value.msg and "HTTP 500" in exc.value.msg
    )
    assert len(api.requests) == 2


def test_slow_server_hits_the_overall_timeout(api: KubeServer, tmp_path: Path) -> None:
    api.delay = 2.0
    client = client_for(api, tmp_path, "token", timeout=0.5, attempts=5, backoff=0.01)
    start = time.monotonic()
    with pytest.raises(CniError) as exc:
        client.get_pod("default", "ibv-app-0")
    assert exc.value.code == KUBE_API_FAILURE
    assert time.monotonic() - start < 1.9  # gave up before the server would have answered once


def test_server_certificate_from_another_ca_is_rejected(api: KubeServer, tmp_path: Path) -> None:
    other = Pki(tmp_path / "other-pki")
    path = api.kubeconfig(tmp_path / "kubeconfig", auth="token")
    text = path.read_text()
    import base64

    wrong_ca = base64.b64encode(other.ca_cert.read_bytes()).decode()
    path.write_text(
        "\n".join(
            f"    certificate-authority-data: {wrong_ca}" if "certificate-authority-data" in line else line
            for line in text.splitlines()
        )
    )
    with pytest.raises(CniError) as exc:
        PodClient(kubeconfig.load(str(path))).get_pod("default", "ibv-app-0")
    assert "TLS verification" in exc.value.msg and "certificate-authority" in exc.value.msg
    assert api.requests == []


def test_nothing_listening_is_an_api_failure(tmp_path: Path, pki: Pki) -> None:
    server = KubeServer(pki)
    server.start()
    path = server.kubeconfig(tmp_path / "kubeconfig")
    server.stop()
    with pytest.raises(CniError) as exc:
        PodClient(kubeconfig.load(str(path)), timeout=2, attempts=2, backoff=0.01).get_pod("default", "x")
    assert exc.value.code == KUBE_API_FAILURE and "ConnectionRefusedError" in exc.value.msg


def test_kubeconfig_without_a_valid_current_context_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text("apiVersion: v1\nclusters: []\ncontexts: []\ncurrent-context: gone\nusers: []\n")
    with pytest.raises(CniError) as exc:
        kubeconfig.load(str(path))
    assert exc.value.code == INVALID_CONFIG and "current-context 'gone'" in exc.value.msg


def test_unreadable_kubeconfig_names_the_key_to_fix(tmp_path: Path) -> None:
    with pytest.raises(CniError) as exc:
        kubeconfig.load(str(tmp_path / "absent"))
    assert exc.value.code == INVALID_CONFIG and "'kubeconfig'" in exc.value.msg
