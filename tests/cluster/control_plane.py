"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the test cluster, in node 1's
network namespace as on a kubeadm control-plane node, TLS everywhere with the harness's PKI.

The API server authorizes with ``Node,RBAC`` and admits with ``NodeRestriction``; service accounts get
projected tokens signed by ``sa.key``; the ``kubernetes`` Service (203.0.113.65) reaches it through
kube-proxy, so in-cluster config works in pods as on a real node.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cluster import pki as pkimod
from cluster import topology as topo
from cluster.build import Binaries
from cluster.pki import Identity
from cluster.procs import Proc, spawn, wait_for

API_PORT = 6443


def api_url() -> str:
    return f"https://{topo.node_ip(1)}:{API_PORT}"


def make_pki(d: Path, nodes: int) -> None:
    pkimod.make_ca(d)
    pkimod.service_account_keys(d)
    api_sans = (
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
        "DNS:localhost",
        f"IP:{topo.KUBERNETES_SERVICE_IP}",
        f"IP:{topo.node_ip(1)}",
        "IP:127.0.0.1",
    )
    ids = [
        Identity("apiserver", "kube-apiserver", sans=api_sans, server=True),
        Identity("etcd-server", "etcd", sans=("DNS:localhost", "IP:127.0.0.1"), server=True),
        Identity("apiserver-etcd-client", "kube-apiserver-etcd-client"),
        Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
        Identity("admin", "kubernetes-admin", ("system:masters",)),
        Identity("controller-manager", "system:kube-controller-manager"),
        Identity("scheduler", "system:kube-scheduler"),
        Identity("kube-proxy", "system:kube-proxy", ("system:node-proxier",)),
    ]
    ids += [
        Identity(f"kubelet-{topo.node_name(n)}", f"system:node:{topo.node_name(n)}", ("system:nodes",))
        for n in range(1, nodes + 1)
    ]
    for who in ids:
        pkimod.issue(d, who)
    ca = d / "ca.crt"
    for stem, user in (
        ("admin", "kubernetes-admin"),
        ("controller-manager", "system:kube-controller-manager"),
        ("scheduler", "system:kube-scheduler"),
        ("kube-proxy", "system:kube-proxy"),
    ):
        pkimod.kubeconfig(d / f"{stem}.kubeconfig", api_url(), ca, d / f"{stem}.crt", d / f"{stem}.key", user)
    for n in range(1, nodes + 1):
        stem = f"kubelet-{topo.node_name(n)}"
        pkimod.kubeconfig(
            d / f"{stem}.kubeconfig",
            api_url(),
            ca,
            d / f"{stem}.crt",
            d / f"{stem}.key",
            f"system:node:{topo.node_name(n)}",
        )


AUDIT_POLICY = "audit-policy.yaml"  # in the PKI dir: present = audit on, also for a restarted API server
AUDIT_LOG = "kube-apiserver-audit.log"


def audit_policy(pki: Path, users: Sequence[str]) -> None:
    """Turn the API server's audit log on for ``users`` (Metadata level: who, verb, object, stage;
    no bodies) and off for everyone else, so that the log holds only what is measured
    (tests/cluster/apicost.py) and costs the other components' requests nothing."""
    rules = [{"level": "Metadata", "users": list(users)}, {"level": "None"}]
    doc = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
           "rules": rules}  # fmt: skip
    (pki / AUDIT_POLICY).write_text(json.dumps(doc))


def _audit_flags(pki: Path, logs: Path) -> list[str]:
    if not (pki / AUDIT_POLICY).exists():
        return []
    return [f"--audit-policy-file={pki / AUDIT_POLICY}", f"--audit-log-path={logs / AUDIT_LOG}",
            "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s"]  # fmt: skip


def apiserver_argv(bins: Binaries, pki: Path, logs: Path | None = None) -> list[str]:
    return [*_apiserver_flags(bins, pki), *(_audit_flags(pki, logs) if logs else [])]


def _apiserver_flags(bins: Binaries, pki: Path) -> list[str]:
    return [
        bins.path("kube-apiserver"),
        "--etcd-servers=https://127.0.0.1:2379",
        f"--etcd-cafile={pki / 'ca.crt'}",
        f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
        f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
        f"--secure-port={API_PORT}",
        "--bind-address=0.0.0.0",
        f"--advertise-address={topo.node_ip(1)}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={topo.SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=lease",
        "--profiling=false",
        "-v=1",
    ]


def start_etcd(bins: Binaries, pki: Path, data: Path, logs: Path, netns: str) -> Proc:
    etcd = spawn(
        "etcd",
        [
            bins.path("etcd"),
            "--name=rcl",
            f"--data-dir={data / 'etcd'}",
            "--listen-client-urls=https://127.0.0.1:2379",
            "--advertise-client-urls=https://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=rcl=http://127.0.0.1:2380",
            f"--cert-file={pki / 'etcd-server.crt'}",
            f"--key-file={pki / 'etcd-server.key'}",
            f"--trusted-ca-file={pki / 'ca.crt'}",
            "--client-cert-auth",
            "--listen-metrics-urls=http://127.0.0.1:2381",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        logs / "etcd.log",
        netns,
    )
    wait_for("etcd /health", lambda: _probe_in_netns(netns, "http://127.0.0.1:2381/health"), 60, etcd)
    return etcd


def start_apiserver(bins: Binaries, pki: Path, logs: Path, netns: str) -> Proc:
    api = spawn("kube-apiserver", apiserver_argv(bins, pki, logs), logs / "kube-apiserver.log", netns)
    wait_for("the API server's /readyz", lambda: _probe_in_netns(netns, f"{api_url()}/readyz", pki), 120, api)
    return api


# kube-controller-manager's and kube-scheduler's: one control plane, so no leader election (a lost
# lease would end them when the API server is away)
COMMON = ("--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "-v=1")


def spawn_scheduler(bins: Binaries, pki: Path, logs: Path, netns: str) -> Proc:
    """kube-scheduler, not waited for. Also to start it again: it exits by design when it finds its
    cache corrupted ("Pod updated on a different node than previously added to", seen after the API
    server came back), and on a real control-plane node kubelet restarts it as a static pod."""
    return spawn(
        "kube-scheduler",
        [
            bins.path("kube-scheduler"),
            *COMMON,
            f"--kubeconfig={pki / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={pki / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={pki / 'scheduler.kubeconfig'}",
        ],
        logs / "kube-scheduler.log",
        netns,
    )


def spawn_controller_manager(bins: Binaries, pki: Path, logs: Path, netns: str) -> Proc:
    """kube-controller-manager, not waited for; also to start it again after a kill (the chaos run:
    kubelet restarts it as a static pod on a real control-plane node)."""
    return spawn(
        "kube-controller-manager",
        [
            bins.path("kube-controller-manager"),
            *COMMON,
            f"--kubeconfig={pki / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={pki / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={pki / 'controller-manager.kubeconfig'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={topo.SERVICE_CIDR}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--controllers=*,-bootstrapsigner,-tokencleaner",
            "--node-monitor-grace-period=20s",
        ],
        logs / "kube-controller-manager.log",
        netns,
    )


def start(bins: Binaries, pki: Path, data: Path, logs: Path, netns: str) -> list[Proc]:
    """The four components in order, each waited for; a failure names the component with its log."""
    procs = [start_etcd(bins, pki, data, logs, netns), start_apiserver(bins, pki, logs, netns)]
    kcm = spawn_controller_manager(bins, pki, logs, netns)
    procs.append(kcm)
    sched = spawn_scheduler(bins, pki, logs, netns)
    procs.append(sched)
    for proc, port in ((kcm, 10257), (sched, 10259)):
        url = f"https://127.0.0.1:{port}/healthz"
        wait_for(
            f"{proc.name}'s /healthz",
            functools.partial(_probe_in_netns, netns, url, pki, verify=False),
            60,
            proc,
        )
    return procs


def _probe_in_netns(netns: str, url: str, pki: Path | None = None, verify: bool = True) -> bool:
    """An HTTP(S) GET from inside the netns (the components listen only there): curl with the admin
    identity."""
    cmd = ["ip", "netns", "exec", netns, "curl", "-sf", "-m", "3", "-o", "/dev/null"]
    if pki is not None:
        cmd += ["--cert", str(pki / "admin.crt"), "--key", str(pki / "admin.key")]
        cmd += ["--cacert", str(pki / "ca.crt")] if verify else ["-k"]
    return subprocess.run([*cmd, url], capture_output=True, check=False).returncode == 0
