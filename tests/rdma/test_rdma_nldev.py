"""The nldev encoder/decoder against RDMA netlink traffic captured from the `rdma` tool (strace -xx).

Normalisation, stated once: the captured requests carry the tool's sequence number (it seeds it from
the clock) and ``nlmsg_pid=0``; the encoder takes the sequence number as an argument, so each request
is rebuilt with the captured ``seq`` and compared byte for byte, header included. Replies carry the
kernel-assigned port id in ``nlmsg_pid``; the decoder ignores it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from rdma_cni.rdma import nldev

FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
if not FIXTURES.is_dir():
    FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "sysfs-rxe-6.1"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="captured netlink fixtures not present")

HDR_RE = re.compile(
    r"\{nlmsg_len=(\d+), nlmsg_type=([^,]+), nlmsg_flags=([^,]+), nlmsg_seq=(\d+), nlmsg_pid=(-?\d+)\}"
)
FLAG_NAMES = {"NLM_F_REQUEST": 1, "NLM_F_MULTI": 2, "NLM_F_ACK": 4, "NLM_F_CAPPED": 0x100}
TYPE_NAMES = {"NLMSG_ERROR": 2, "NLMSG_DONE": 3}


@dataclass
class Captured:
    call: str  # "sendto" or "recvmsg"
    data: bytes  # the whole netlink message, rebuilt from strace's decoded header + hex payload


def _flags(text: str) -> int:
    return sum(FLAG_NAMES[f] if f in FLAG_NAMES else int(f, 0) for f in text.split("|"))


def _type(text: str) -> int:
    word = text.split()[0]
    return TYPE_NAMES[word] if word in TYPE_NAMES else int(word, 0)


def _header(m: re.Match[str]) -> bytes:
    length, mtype, flags, seq, pid = m.groups()
    return struct.pack("=IHHIi", int(length), _type(mtype), _flags(flags), int(seq), int(pid))


def parse_strace(path: Path) -> list[Captured]:
    out = []
    for line in path.read_text().splitlines():
        call = re.match(r"^\d+\s+(sendto|recvmsg)\(", line)
        if not call:
            continue
        m = HDR_RE.search(line)
        assert m, line
        rest = line[m.end() :]
        hdr = _header(m)
        if rest.startswith(', "'):
            payload = bytes.fromhex(rest[3 : rest.index('"', 3)].replace("\\x", ""))
        elif rest.startswith(", {error="):  # NLMSG_ERROR: errno + the (capped) request header
            err = int(re.match(r", \{error=(-?\d+)", rest).group(1))  # type: ignore[union-attr]
            inner = HDR_RE.search(rest)
            assert inner
            payload = struct.pack("=i", err) + _header(inner)
        elif rest.startswith(", 0]"):  # NLMSG_DONE
            payload = struct.pack("=i", 0)
        else:
            payload = b""
        data = hdr + payload
        assert len(data) == int(m.group(1)), line
        out.append(Captured(call.group(1), data))
    return out


def sent(path: Path) -> list[bytes]:
    return [c.data for c in parse_strace(path) if c.call == "sendto"]


def received(path: Path) -> list[nldev.Message]:
    return [m for c in parse_strace(path) if c.call == "recvmsg" for m in nldev.decode(c.data)]


def seq_of(data: bytes) -> int:
    return int(struct.unpack_from("=I", data, 8)[0])


def test_strace_parser_rebuilds_whole_messages() -> None:
    msgs = parse_strace(FIXTURES / "host/netlink/system-show.strace")
    assert [c.call for c in msgs] == [
        "sendto",
        "recvmsg",
        "recvmsg",
        "recvmsg",
        "sendto",
        "recvmsg",
        "recvmsg",
    ]
    assert [len(c.data) for c in msgs] == [16, 112, 112, 20, 16, 40, 36]


@pytest.mark.parametrize("state", ["host", "pod", "exclusive"])
def test_system_show_requests_byte_for_byte(state: str) -> None:
    dump, sys_get = sent(FIXTURES / state / "netlink/system-show.strace")
    assert nldev.dev_dump_request(seq_of(dump)) == dump
    assert nldev.sys_get_request(seq_of(sys_get)) == sys_get


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_system_set_netns_request_byte_for_byte(mode: str) -> None:
    dump, sys_set = sent(FIXTURES / f"exclusive/netlink/set-{mode}.strace")
    assert nldev.dev_dump_request(seq_of(dump)) == dump
    assert nldev.sys_set_request(seq_of(sys_set), mode) == sys_set


@pytest.mark.parametrize("name", ["dev-show", "dev-show-json"])
def test_dev_get_requests_byte_for_byte(name: str) -> None:
    dump, get0, get1 = sent(FIXTURES / f"host/netlink/{name}.strace")
    assert nldev.dev_dump_request(seq_of(dump)) == dump
    assert nldev.dev_get_request(seq_of(get0), 0) == get0
    assert nldev.dev_get_request(seq_of(get1), 1) == get1


def test_port_get_requests_byte_for_byte() -> None:
    dump, port0, port1 = sent(FIXTURES / "host/netlink/link-show.strace")
    assert nldev.dev_dump_request(seq_of(dump)) == dump
    assert nldev.port_get_request(seq_of(port0), 0, 1) == port0
    assert nldev.port_get_request(seq_of(port1), 1, 1) == port1


def test_set_device_netns_request_layout() -> None:
    """Not captured (rxe refuses the move before any reply matters); built like the tool's other SETs:
    DEV_INDEX u32 then NET_NS_FD u32 (attr 68), REQUEST|ACK."""
    msg = nldev.dev_set_netns_request(7, 1, 9)
    assert msg == struct.pack("=IHHII", 32, 0x1402, 5, 7, 0) + bytes.fromhex(
        "08000100010000000800440009000000"
    )


@pytest.mark.parametrize("state", ["host", "pod", "exclusive"])
def test_decoded_netns_mode_equals_what_the_tool_printed(state: str) -> None:
    replies = received(FIXTURES / state / "netlink/system-show.strace")
    sys_reply = next(
        m for m in replies if m.cmd == nldev.RDMA_NLDEV_CMD_SYS_GET and m.type != nldev.NLMSG_ERROR
    )
    info = nldev.system_info(sys_reply)
    printed = (FIXTURES / state / "netlink/system-show.stdout").read_text()
    assert printed.startswith(f"netns {info.netns_mode} copy-on-fork {'on' if info.copy_on_fork else 'off'}")
    assert info == nldev.parse_system_show(printed)


def test_decoded_devices_equal_rdma_dev_json() -> None:
    replies = received(FIXTURES / "host/netlink/dev-show-json.strace")
    dump = [nldev.device_of(m) for m in replies if m.flags & nldev.NLM_F_MULTI and m.type == 0x1401]
    shown = json.loads((FIXTURES / "host/netlink/dev-show-json.stdout").read_text())
    assert [(d.index, d.name, d.node_type, d.node_guid, d.sys_image_guid) for d in dump] == [
        (s["ifindex"], s["ifname"], s["node_type"], s["node_guid"], s["sys_image_guid"]) for s in shown
    ]
    assert {d.protocol for d in dump} == {"roce"}


def test_decoded_ports_equal_rdma_link_show() -> None:
    replies = received(FIXTURES / "host/netlink/link-show.strace")
    ports = [nldev.port_of(m) for m in replies if m.type == 0x1401 and not m.flags & nldev.NLM_F_MULTI]
    printed = (FIXTURES / "host/netlink/link-show.stdout").read_text().split("\n")
    assert [
        f"link {p.dev_name}/{p.port} state {p.state} physical_state LINK_UP netdev {p.ndev_name} "
        for p in ports
    ] == [line for line in printed if line]


def test_acks_and_done_decode() -> None:
    replies = received(FIXTURES / "exclusive/netlink/set-exclusive.strace")
    assert [m.type for m in replies] == [0x1401, 0x1401, nldev.NLMSG_DONE, nldev.NLMSG_ERROR]
    assert replies[-1].error == 0


class ReplayKernel:
    """Answers each request with the captured replies (seq rewritten): a stand-in for the kernel's
    socket, which this machine's kernel refuses (no ib_core)."""

    def __init__(self, strace: Path) -> None:
        caps = parse_strace(strace)
        self.rounds: list[list[bytes]] = []
        for c in caps:
            if c.call == "sendto":
                self.rounds.append([])
            else:
                self.rounds[-1].append(c.data)
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for replies in self.rounds:
            req = self.theirs.recv(65536)
            self.requests.append(req)
            seq = struct.pack("=I", seq_of(req))
            for r in replies:
                self.theirs.send(r[:8] + seq + r[12:])


def client_on(kernel: ReplayKernel) -> nldev.NldevSocket:
    nl = nldev.NldevSocket.__new__(nldev.NldevSocket)
    nl.sock = kernel.ours
    nl._seq = iter(range(1000, 2000))
    return nl


def test_client_reads_mode_through_a_dump_then_sys_get() -> None:
    kernel = ReplayKernel(FIXTURES / "exclusive/netlink/system-show.strace")
    nl = client_on(kernel)
    assert [d.name for d in nl.devices()] == ["mlx5_bond_0", "mlx5_bond_1"]
    assert nl.sys_get() == nldev.SystemInfo("exclusive", True)
    assert kernel.requests == [nldev.dev_dump_request(1000), nldev.sys_get_request(1001)]


def test_client_raises_the_kernel_errno() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    nl = nldev.NldevSocket.__new__(nldev.NldevSocket)
    nl.sock, nl._seq = a, iter(range(5, 6))

    def kernel() -> None:
        req = b.recv(65536)
        err = struct.pack("=IHHIi", 36, nldev.NLMSG_ERROR, 0x100, seq_of(req), 0) + struct.pack(
            "=i", -errno.EOPNOTSUPP
        )
        b.send(err + req[:16])

    t = threading.Thread(target=kernel)
    t.start()
    with pytest.raises(nldev.NldevError) as e:
        nl.set_device_netns(0, 3)
    t.join()
    assert e.value.errno == errno.EOPNOTSUPP


def test_socket_refused_here_falls_back_to_the_rdma_tool() -> None:
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nldev.NETLINK_RDMA).close()
        pytest.skip("this kernel has RDMA netlink")
    except OSError as e:
        assert e.errno == errno.EPROTONOSUPPORT
    with pytest.raises(nldev.NldevError) as err:
        nldev.system_netns_mode()
    assert "rdma system show" in str(err.value) or "not installed" in str(err.value)


def test_device_move_without_rdma_netlink_fails_through_the_tool_with_its_message() -> None:
    if Path("/sys/module/ib_core").exists():
        pytest.skip("this kernel has ib_core")
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(nldev.NldevError) as e:
            nldev.set_device_netns("mlx5_bond_0", fd)
        assert "rdma dev set mlx5_bond_0 netns /proc/" in str(e.value)
        with pytest.raises(OSError) as e2:  # from a pod netns there is no tool fallback
            nldev.set_device_netns("mlx5_bond_0", fd, from_netns_fd=fd)
        assert e2.value.errno == errno.EPROTONOSUPPORT
    finally:
        os.close(fd)


@pytest.fixture
def captured_rdma_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `rdma` executable first on PATH that prints what the real tool printed (captured), for the
    fallback path; only meaningful where this kernel refuses the RDMA netlink socket."""
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nldev.NETLINK_RDMA).close()
        pytest.skip("this kernel has RDMA netlink: the fallback is not taken")
    except OSError:
        pass
    tool = tmp_path / "rdma"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        f'case "$*" in "system show") cat {FIXTURES}/exclusive/netlink/system-show.stdout;; '
        f'"dev show") cat {FIXTURES}/host/netlink/dev-show.stdout;; *) exit 0;; esac\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


def test_fallback_reads_what_the_tool_prints(captured_rdma_tool: Path) -> None:
    assert nldev.system_netns_mode() == nldev.SystemInfo("exclusive", True)
    assert [(d.index, d.name, d.node_type) for d in nldev.list_devices()] == [
        (0, "mlx5_bond_0", "ca"),
        (1, "mlx5_bond_1", "ca"),
    ]
    nldev.set_system_netns_mode("shared")
    calls = (captured_rdma_tool / "calls").read_text().splitlines()
    assert calls == ["system show", "dev show", "system set netns shared"]


def test_mode_falls_back_to_the_tool_for_the_live_sysfs(captured_rdma_tool: Path, tmp_path: Path) -> None:
    from rdma_cni.rdma import mode

    assert mode.current_netns_mode(str(tmp_path / "no-sysfs"), ask_kernel=True) == "exclusive"
