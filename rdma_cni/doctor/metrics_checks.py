"""Whether the agent's Prometheus endpoint answers, and where it is.

The agent notes its endpoint in ``agent-metrics.json`` beside its socket (``/run/rdma-cni`` by
default, or the directory of ``$RDMA_CNI_AGENT_SOCKET``) when started with ``--metrics-address``;
the doctor reads that note and asks the endpoint once (in the node's netns, where the agent
listens), so "no metrics in Grafana" is told apart from "the agent serves none" and "it serves
them but does not answer". Never FAIL: a node without metrics can still start pods.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from typing import Any

from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.findings import OK, SKIP, WARN, Finding
from rdma_cni.doctor.node import NodeSnapshot
from rdma_cni.net.netns import entered, open_netns

NOTE = "agent-metrics.json"
DEFAULT_SOCKET = "/run/rdma-cni/agent.sock"
TIMEOUT = 2.0
CHECK = "metrics"


def note_dirs(snap: NodeSnapshot) -> list[str]:
    sock = os.environ.get("RDMA_CNI_AGENT_SOCKET") or DEFAULT_SOCKET
    return list(dict.fromkeys([os.path.dirname(os.path.abspath(sock)), snap.run_dir]))


def _note(snap: NodeSnapshot) -> tuple[str, dict[str, Any]] | None:
    for directory in note_dirs(snap):
        path = os.path.join(directory, NOTE)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("url"), str):
            return path, data
    return None


def check_metrics(snap: NodeSnapshot) -> list[Finding]:
    found = _note(snap)
    if found is None:
        where = " or ".join(os.path.join(d, NOTE) for d in note_dirs(snap))
        return [Finding(CHECK, SKIP, f"rdma-agent serves no metrics here (no {where}): start it with "
                        "--metrics-address HOST:PORT to have them")]
    path, note = found
    url = str(note["url"])
    try:
        series = fetch_series(url, snap.paths.netns)
    except (OSError, http.client.HTTPException, ValueError, CniError) as exc:
        return [
            Finding(
                CHECK,
                WARN,
                f"{url} (rdma-agent pid {note.get('pid', '?')}, from {path}) does not answer: {exc}",
                "is rdma-agent running? (`rdma-agent --probe`; its log); is --metrics-address free?",
            )
        ]
    return [Finding(CHECK, OK, f"{url} answers: {series} series (Prometheus scrapes it there)")]


def fetch_series(url: str, netns: str = "") -> int:
    """GET ``url`` (inside ``netns`` when given) and count the samples of the text format."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"not an http://HOST:PORT URL: {url!r}")
    sock = _connect(parts.hostname, parts.port, netns)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)
    conn.sock = sock
    try:
        conn.request("GET", parts.path or "/metrics")
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
        if response.status != 200:
            raise ValueError(f"HTTP {response.status} {response.reason}")
    finally:
        conn.close()
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def _connect(host: str, port: int, netns: str) -> socket.socket:
    """A socket belongs to the netns it was created in: create (and connect) it in the node's."""
    if not netns:
        return socket.create_connection((host, port), timeout=TIMEOUT)

    with open_netns(netns) as ns, entered(ns):
        return socket.create_connection((host, port), timeout=TIMEOUT)
