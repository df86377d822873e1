"""Every socket the node serves (the agent's, the device plugin's, the DRA driver's) is root's alone:
:func:`rdma_cni.kube.sockets.make_private` makes it 0600 and refuses a socket in a directory others
may write. Real unix sockets, and a real gRPC server bound as the device plugin and DRA driver bind.
"""

from __future__ import annotations

import os
import socket
import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rdma_cni.kube.sockets import make_private

pytestmark = pytest.mark.tenant


def bound(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


def test_a_socket_others_could_reach_becomes_0600(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_insecure_port(f"unix:{d / 'rdma.sock'}")  # grpc binds 0755 here: anyone may connect
    try:
        make_private(str(d / "rdma.sock"))
        assert stat.S_IMODE(os.stat(d / "rdma.sock").st_mode) == 0o600
    finally:
        server.stop(0)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write_is_refused_naming_it(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(mode)
    with bound(d / "rdma.sock"), pytest.raises(RuntimeError) as err:
        make_private(str(d / "rdma.sock"))
    assert str(d) in str(err.value) and "refusing to serve" in str(err.value)


def test_a_sticky_world_writable_directory_is_allowed(tmp_path: Path) -> None:
    """As /tmp: others may not remove or rename what is ours there."""
    d = tmp_path / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    with bound(d / "rdma.sock"):
        make_private(str(d / "rdma.sock"))


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, 65534, 65534)
    with bound(d / "rdma.sock"), pytest.raises(RuntimeError) as err:
        make_private(str(d / "rdma.sock"))
    assert "uid 65534" in str(err.value)


def test_a_file_that_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rdma.sock").write_text("")
    with pytest.raises(RuntimeError, match="is not a socket"):
        make_private(str(tmp_path / "rdma.sock"))
