"""The cluster's certificates: one CA and a key pair per identity, made with openssl, as kubeadm lays
them out (``ca``, ``apiserver``, ``apiserver-kubelet-client``, ``etcd-server``, ``apiserver-etcd-client``,
``admin``, ``controller-manager``, ``scheduler``, ``kube-proxy``, ``kubelet-<node>``, and the
service-account signing pair ``sa``).

Identities are what the API server's authorizers see: CN is the user, O the groups. The kubelets get
``system:node:<name>`` in ``system:nodes``, so the Node authorizer and NodeRestriction judge them as on
a real cluster; kubectl is ``kubernetes-admin`` in ``system:masters``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

DAYS = "30"


@dataclass(frozen=True)
class Identity:
    name: str  # file stem
    cn: str
    orgs: tuple[str, ...] = ()
    sans: tuple[str, ...] = ()  # "DNS:x" / "IP:y"
    server: bool = False


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-800:]}")


def _key(path: Path) -> None:
    _run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def make_ca(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if (d / "ca.crt").exists():
        return
    _key(d / "ca.key")
    _run(
        "openssl",
        "req",
        "-x509",
        "-new",
        "-key",
        str(d / "ca.key"),
        "-subj",
        "/CN=rdma-cni-test-cluster-ca",
        "-days",
        DAYS,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        str(d / "ca.crt"),
    )


def issue(d: Path, who: Identity) -> None:
    """``<name>.key`` and ``<name>.crt`` signed by the CA in ``d``."""
    if (d / f"{who.name}.crt").exists():
        return
    _key(d / f"{who.name}.key")
    subj = "".join(f"/O={o}" for o in who.orgs) + f"/CN={who.cn}"
    usage = "serverAuth" if who.server else "clientAuth"
    if who.server and not who.sans:
        raise ValueError(f"{who.name}: a serving certificate needs subjectAltNames")
    ext = [
        f"extendedKeyUsage={usage}",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "basicConstraints=critical,CA:FALSE",
    ]
    if who.sans:
        ext.append("subjectAltName=" + ",".join(who.sans))
    csr = d / f"{who.name}.csr"
    cmd = ["openssl", "req", "-new", "-key", str(d / f"{who.name}.key"), "-subj", subj, "-out", str(csr)]
    for e in ext:
        cmd += ["-addext", e]
    _run(*cmd)
    _run(
        "openssl",
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(d / "ca.crt"),
        "-CAkey",
        str(d / "ca.key"),
        "-CAcreateserial",
        "-days",
        DAYS,
        "-copy_extensions",
        "copyall",
        "-out",
        str(d / f"{who.name}.crt"),
    )
    csr.unlink()


def service_account_keys(d: Path) -> None:
    """The pair the API server signs projected tokens with (and verifies them by)."""
    if (d / "sa.key").exists():
        return
    _key(d / "sa.key")
    _run("openssl", "pkey", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))


def kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    """A kubeconfig naming files, not embedding them: every component reads the same PKI dir."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rdma-cni-test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "default", "context": {"cluster": "rdma-cni-test", "user": user}}],
        "current-context": "default",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path
