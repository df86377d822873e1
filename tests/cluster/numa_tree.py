"""A fake ``/sys/devices/system/node`` that shows kubelet 2 NUMA nodes on a 1-NUMA-node machine.

Why: the seed pod's GPUs and RDMA bonds are aligned by kubelet's topology manager
(``topologyManagerPolicy: best-effort``), which only aligns over the NUMA nodes it knows of. kubelet
learns them from cadvisor's ``MachineInfo.Topology``, and this machine (2 CPUs, one NUMA node)
would give it one: every hint would be "NUMA 0" and nothing would be tested. So each cluster node
gets, in its own private mount namespace, a tree laid by :func:`build_numa_tree` bind-mounted over
``/sys/devices/system/node``::

    mount --bind <tree> /sys/devices/system/node        # inside the node's `unshare -m`, never on the host

That one bind mount is all kubelet needs. What cadvisor v0.60.5 reads (github.com/google/cadvisor/lib
@v0.60.5, the version k8s.io/kubernetes v1.37.2's go.mod requires; ``machine.GetTopology`` ->
``utils/sysinfo.GetNodesInfo`` over ``utils/sysfs.realSysFs``), and what this tree gives it:

- ``/sys/devices/system/node/node*[0-9]`` (glob; the ID from the regexp ``node/node(\\d*)``): the
  node directories ``node0`` .. ``node<nodes-1>``;
- ``nodeN/cpu*[0-9]`` (glob), then through each, ``topology/core_id`` and
  ``topology/physical_package_id``: symlinks ``nodeN/cpuK -> /sys/devices/system/cpu/cpuK`` into
  the real, unchanged cpu directories, the CPUs split in contiguous blocks (cpu0 on node0, cpu1 on
  node1 here). The links are absolute where the kernel's are relative (``../../cpu/cpuK``): they
  resolve the same once mounted, and also where the tree lies unmounted (a test reads it there);
- ``/sys/devices/system/cpu/online`` and ``cpuK/cache/index*/{id,size,level,type,shared_cpu_map}``:
  real, not faked (cadvisor finds the caches by CPU number, not through the node);
- ``nodeN/meminfo`` (``MemTotal:\\s*([0-9]+) kB``): node0's lines with every value split evenly;
- ``nodeN/hugepages/hugepages-<size>kB/nr_hugepages``: split evenly too;
- ``nodeN/distance`` (space-separated): 10 to itself, 20 to every other node, as a 2-socket box.

cadvisor does **not** read the ``/sys/devices/system/cpu/cpuK/nodeM`` links (nor ``cpulist``,
``cpumap``, ``has_*``, ``online``, ``possible``), and kubelet v1.37.2 reads nothing under
``/sys/devices/system/node`` itself (its only sysfs reads are ``cpu/possible`` and
``cpu/cpuN/thermal_throttle``): no second bind mount is needed. Those links keep pointing at
``../node/node0`` for every CPU, i.e. into the fake tree's node0; only a tool that follows them
(numactl/libnuma, not kubelet) would see cpu1 claimed by node0. The rest of a node directory is
still written, in the kernel's formats (``cpulist``, ``cpumap``, ``numastat``, ``vmstat``, the
top-level ``has_cpu``/``has_memory``/``has_normal_memory``/``online``/``possible`` lists, the
``subsystem`` link), so that a reader other than cadvisor sees a consistent node. Not written: the
``memoryN`` block links and the write-only ``compact``/``reclaim``/``demote`` files.

The tree is a snapshot: memory figures are those at build time (a VM whose memory grows later shows
the old total per node; kubelet takes its capacity from /proc/meminfo, not from here).

Usage::

    tree = build_numa_tree(Path("/run/rcl/node1/numa"))       # -> .../numa/node (mount this)
    subprocess.run(bind_mount_args(tree), check=True)        # inside the node's mount namespace
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

SYS_NODE = Path("/sys/devices/system/node")
SYS_CPU = Path("/sys/devices/system/cpu")
LOCAL_DISTANCE, REMOTE_DISTANCE = 10, 20
# Top-level node lists (drivers/base/node.c node_state_attr): which nodes are in each state.
NODE_LISTS = (
    "possible",
    "online",
    "has_normal_memory",
    "has_high_memory",
    "has_memory",
    "has_cpu",
    "has_generic_initiator",
)
_MEMINFO = re.compile(r"^(Node )(\d+)( \S+:)(\s*)(\d+)(.*)$")
_COUNTER = re.compile(r"^(\S+) (\d+)$")


# --------------------------------------------------------------------------- kernel formats


def parse_list(text: str) -> list[int]:
    """A kernel list (``%*pbl``: ``0-3,8,10-11``; empty for none) as sorted numbers."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def format_list(items: Iterable[int]) -> str:
    """Numbers as the kernel prints a list (``%*pbl``): ranges of consecutive ones, comma-separated."""
    nums = sorted(set(items))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


def format_mask(items: Iterable[int], nbits: int) -> str:
    """A bitmap as the kernel prints it (``%*pb``, e.g. ``cpumap``): hex in 32-bit groups, most
    significant first, comma-separated, each zero-padded; the first group only as wide as the bits
    left over (``nbits`` = nr_cpu_ids: 2 CPUs -> ``3``, 36 -> ``f,ffffffff``)."""
    mask = 0
    for i in items:
        mask |= 1 << i
    groups: list[str] = []
    chunk = nbits % 32 or 32
    start = ((nbits + 31) // 32 - 1) * 32
    while start >= 0:
        val = (mask >> start) & ((1 << chunk) - 1)
        groups.append(f"{val:0{(chunk + 3) // 4}x}")
        start -= 32
        chunk = 32
    return ",".join(groups)


def split_evenly(value: int, parts: int) -> list[int]:
    """``value`` in ``parts`` shares that sum to it, the remainder on the lowest ones (7, 2 -> 4, 3)."""
    return [value // parts + (1 if i < value % parts else 0) for i in range(parts)]


def split_cpus(cpus: Sequence[int], nodes: int) -> list[list[int]]:
    """The CPUs in ``nodes`` contiguous blocks, as sockets number them (0,1 on 2 nodes -> [0], [1])."""
    ordered = sorted(cpus)
    return [ordered[n * len(ordered) // nodes : (n + 1) * len(ordered) // nodes] for n in range(nodes)]


def split_meminfo(text: str, nodes: int) -> list[str]:
    """``nodeN/meminfo`` of ``nodes`` nodes from one node's: each line's value split evenly, the node
    number replaced, the value right-aligned to where it ended before (the kernel's ``%8lu`` /
    ``%5u`` columns are kept since a share is never wider than the whole)."""
    out: list[list[str]] = [[] for _ in range(nodes)]
    for line in text.splitlines():
        m = _MEMINFO.match(line)
        if m is None:
            for n in range(nodes):
                out[n].append(line)
            continue
        head, _, label, spaces, digits, tail = m.groups()
        width = len(spaces) + len(digits)
        for n, share in enumerate(split_evenly(int(digits), nodes)):
            out[n].append(f"{head}{n}{label}{str(share).rjust(width)}{tail}")
    return ["".join(f"{line}\n" for line in lines) for lines in out]


def split_counters(text: str, nodes: int) -> list[str]:
    """``name value`` lines (``numastat``, ``vmstat``) with every value split evenly."""
    out: list[list[str]] = [[] for _ in range(nodes)]
    for line in text.splitlines():
        m = _COUNTER.match(line)
        for n in range(nodes):
            out[n].append(line if m is None else f"{m.group(1)} {split_evenly(int(m.group(2)), nodes)[n]}")
    return ["".join(f"{line}\n" for line in lines) for lines in out]


def distance_row(node: int, nodes: int, local: int = LOCAL_DISTANCE) -> str:
    return " ".join(str(local if m == node else REMOTE_DISTANCE) for m in range(nodes)) + "\n"


# --------------------------------------------------------------------------- the tree


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # write-only (compact, reclaim, demote) or gone
        return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o444)


def nr_cpu_ids(cpu_dir: Path = SYS_CPU) -> int:
    """How many bits the kernel's CPU masks have: the highest possible CPU + 1."""
    return max(parse_list((cpu_dir / "possible").read_text())) + 1


def build_numa_tree(dest: Path, nodes: int = 2, *, source: Path = SYS_NODE, cpu_dir: Path = SYS_CPU) -> Path:
    """Lay ``dest``/node: ``nodes`` NUMA nodes splitting the one real node of ``source`` (its CPUs in
    contiguous blocks, its memory and counters evenly), for a bind mount over ``source``. Returns the
    tree's root (named ``node``, as cadvisor's ID regexp ``node/node(\\d*)`` wants it wherever it lies).
    An existing tree there is replaced. ``cpu_dir`` is where the CPU links point (the real one; a
    test may point elsewhere). ValueError unless ``source`` has exactly one node with CPUs and
    ``1 <= nodes <= 64``."""
    if not 1 <= nodes <= 64:
        raise ValueError(f"nodes must be 1..64, not {nodes}")
    real = sorted(p for p in source.glob("node*[0-9]") if p.is_dir())
    if len(real) != 1:
        raise ValueError(f"{source} has {len(real)} NUMA nodes; build_numa_tree splits exactly one")
    node0 = real[0]
    cpus = parse_list((node0 / "cpulist").read_text())
    if not cpus:
        raise ValueError(f"{node0} has no CPU")
    blocks = split_cpus(cpus, nodes)
    nbits = nr_cpu_ids(cpu_dir)
    local = int((node0 / "distance").read_text().split()[0])

    root = dest / "node"
    if root.exists():
        _make_writable(root)
        shutil.rmtree(root)
    root.mkdir(parents=True)

    every, with_cpu = range(nodes), [n for n in range(nodes) if blocks[n]]
    for name in NODE_LISTS:
        text = _read(source / name)
        if text is None:
            continue  # this kernel has no such list (has_high_memory: 32-bit only)
        listed = every if name != "has_cpu" else with_cpu
        _write(root / name, (format_list(listed) if text.strip() else "") + "\n")
    for name in ("uevent",):
        text = _read(source / name)
        if text is not None:
            _write(root / name, text)

    meminfo = split_meminfo(_read(node0 / "meminfo") or "", nodes)
    counters = {
        name: split_counters(_read(node0 / name) or "", nodes)
        for name in ("numastat", "vmstat")
        if (node0 / name).exists()
    }
    for n in every:
        d = root / f"node{n}"
        d.mkdir()
        for cpu in blocks[n]:
            os.symlink(cpu_dir / f"cpu{cpu}", d / f"cpu{cpu}")
        _write(d / "cpulist", format_list(blocks[n]) + "\n")
        _write(d / "cpumap", format_mask(blocks[n], nbits) + "\n")
        _write(d / "distance", distance_row(n, nodes, local))
        _write(d / "meminfo", meminfo[n])
        for name, texts in counters.items():
            _write(d / name, texts[n])
        _write(d / "uevent", "")
        os.symlink("/sys/bus/node", d / "subsystem")
        _split_hugepages(node0 / "hugepages", d / "hugepages", n, nodes)
    for d in [root, *(root / f"node{n}" for n in every)]:
        d.chmod(0o755)
    return root


def _split_hugepages(src: Path, dst: Path, n: int, nodes: int) -> None:
    """``hugepages/hugepages-<size>kB/``: the page counts split evenly, other readable files copied."""
    dst.mkdir()
    if not src.is_dir():
        return
    for size in sorted(p for p in src.iterdir() if p.is_dir()):
        for f in sorted(size.iterdir()):
            text = _read(f)
            if text is None:
                continue
            if text.strip().isdigit():
                text = f"{split_evenly(int(text), nodes)[n]}\n"
            _write(dst / size.name / f.name, text)


def _make_writable(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o755)


def bind_mount_args(tree: Path, target: Path = SYS_NODE) -> list[str]:
    """The command that puts ``tree`` over ``target``: run it only inside a private mount namespace
    (``unshare -m``, which makes every mount private by default), never on the host."""
    return ["mount", "--bind", str(tree), str(target)]
