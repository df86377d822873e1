"""Where the agent's metrics are served: ``--metrics-address HOST:PORT`` parsed and bound.

Bound by the agent's parent before it publishes its socket (a bad or busy address stops the agent
with the reason, before any pod could depend on it), then handed to the metrics process. Bound with
SO_REUSEPORT: the node's next agent (a rolling update's surge pod) binds the same port while this one
runs. Stdlib only: the parent never imports prometheus_client.
"""

from __future__ import annotations

import socket


def listen(address: str) -> socket.socket:
    """A listening TCP socket for ``HOST:PORT`` (``[v6]:PORT`` too). Raises ValueError naming the
    option and the fix for a bad value, OSError when the address cannot be bound."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(
            f"--metrics-address {address!r}: expected HOST:PORT with a port 1-65535, e.g. 0.0.0.0:9513"
        )
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"--metrics-address {address!r}: {host!r} is not an address of this node ({exc})") \
            from exc
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A rolling update starts the node's new agent while the old one still listens (a surge pod,
        # hostNetwork): both bind the port, the kernel spreads scrapes over the two until the old one
        # exits. Only processes of the same user that set it too may share the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    """Where a client on this node reaches it: a wildcard bind is asked on loopback."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
