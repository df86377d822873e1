"""Which API server to talk to and how to prove who we are, read from a kubeconfig file.

Only what a node component needs: the current context's cluster (server, CA as data or file,
``insecure-skip-tls-verify``) and user (bearer token or token file, client certificate and key as data
or files). Relative file paths are relative to the kubeconfig, as kubectl resolves them. Secrets are
held in fields that ``repr`` never shows, so a logged config cannot leak a token.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from rdma_cni.cni.errors import INVALID_CONFIG, CniError


@dataclass(frozen=True)
class KubeConfig:
    path: str
    server: str
    ca_data: bytes | None = field(default=None, repr=False)
    insecure: bool = False
    token: str = field(default="", repr=False)
    token_file: str = ""
    cert_data: bytes | None = field(default=None, repr=False)
    key_data: bytes | None = field(default=None, repr=False)

    def bearer_token(self) -> str:
        """The token, re-read from ``token_file`` on every call: projected tokens rotate."""
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    return f.read().strip()
            except OSError as exc:
                raise CniError(
                    INVALID_CONFIG, f"kubeconfig {self.path}: cannot read tokenFile {self.token_file}: {exc}"
                ) from exc
        return self.token


def _parse_yaml(text: str) -> Any:
    """``safe_load`` with libyaml's C loader when PyYAML was built with it (several times faster on
    a kubeconfig with long base64 certificates); the pure-Python loader reads the same documents."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)


def load(path: str) -> KubeConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CniError(INVALID_CONFIG, f"kubeconfig {path} cannot be read: {exc}; fix 'kubeconfig'") from exc
    try:
        doc = _parse_yaml(text)
    except yaml.YAMLError as exc:
        raise CniError(INVALID_CONFIG, f"kubeconfig {path} is not readable YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise CniError(INVALID_CONFIG, f"kubeconfig {path} must be a mapping with clusters, users, contexts")
    return _from_doc(doc, path)


def _from_doc(doc: dict[str, Any], path: str) -> KubeConfig:
    base = os.path.dirname(os.path.abspath(path))
    context_name = doc.get("current-context")
    contexts = _named(doc, "contexts", "context", path)
    if not context_name:
        if len(contexts) != 1:
            raise CniError(INVALID_CONFIG, f"kubeconfig {path} has no current-context: set it")
        context_name = next(iter(contexts))
    context = contexts.get(str(context_name))
    if context is None:
        raise CniError(
            INVALID_CONFIG, f"kubeconfig {path}: current-context {context_name!r} is not in contexts"
        )
    cluster = _named(doc, "clusters", "cluster", path).get(str(context.get("cluster", "")))
    if cluster is None:
        raise CniError(
            INVALID_CONFIG, f"kubeconfig {path}: context {context_name!r} names an unknown cluster"
        )
    user = _named(doc, "users", "user", path).get(str(context.get("user", "")), {})
    if (user.get("exec") or user.get("auth-provider")) and not (user.get("token") or user.get("tokenFile")):
        raise CniError(
            INVALID_CONFIG,
            f"kubeconfig {path}: exec/auth-provider credentials are not supported by a CNI plugin; "
            "give the user a token, tokenFile or client certificate",
        )
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise CniError(INVALID_CONFIG, f"kubeconfig {path}: cluster server must be an https:// URL")
    return KubeConfig(
        path=path,
        server=server.rstrip("/"),
        ca_data=_data_or_file(cluster, "certificate-authority", base, path),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(user.get("token") or ""),
        token_file=_resolve(base, str(user.get("tokenFile") or "")),
        cert_data=_data_or_file(user, "client-certificate", base, path),
        key_data=_data_or_file(user, "client-key", base, path),
    )


def _named(doc: dict[str, Any], key: str, inner: str, path: str) -> dict[str, dict[str, Any]]:
    """``clusters: [{name, cluster: {...}}]`` -> {name: {...}}."""
    out: dict[str, dict[str, Any]] = {}
    for entry in doc.get(key) or []:
        if not isinstance(entry, dict) or not isinstance(entry.get(inner), dict) or "name" not in entry:
            raise CniError(
                INVALID_CONFIG, f"kubeconfig {path}: every entry of '{key}' needs 'name' and '{inner}'"
            )
        out[str(entry["name"])] = entry[inner]
    return out


def _resolve(base: str, file_path: str) -> str:
    return os.path.join(base, file_path) if file_path else ""


def _data_or_file(section: dict[str, Any], key: str, base: str, path: str) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CniError(INVALID_CONFIG, f"kubeconfig {path}: '{key}-data' is not valid base64") from exc
    file_path = section.get(key)
    if not file_path:
        return None
    full = _resolve(base, str(file_path))
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CniError(INVALID_CONFIG, f"kubeconfig {path}: cannot read '{key}' file {full}: {exc}") from exc
