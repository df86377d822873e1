"""Port counter files of a simulated RDMA device, laid out as the kernel exports them.

``ports/<p>/counters/`` (the InfiniBand PMA counters, Documentation/ABI/stable/
sysfs-class-infiniband) exists on mlx5 and not on rxe; ``ports/<p>/hw_counters/`` exists on both
with the driver's own names: rxe's are those of the captured tree (``shared/fixtures/sysfs-rxe-6.1``),
mlx5's those the kernel documents for the mlx5 driver. Values are written by rename, like every
simulated file, so a reader sees the old or the new number, never half of one.

    write_counters(root, "mlx5_bond_0", 1, "mlx5")
    bump(root, "mlx5_bond_0", 1, "counters", "port_xmit_data", 1000)
"""

from __future__ import annotations

import os

from rdma_cni.sim.tree import port_path, put

PMA_COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
MLX5_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
RXE_HW_COUNTERS = (
    "ack_deferred",
    "completer_retry_err",
    "duplicate_request",
    "lifespan",
    "link_downed",
    "out_of_seq_request",
    "rcvd_pkts",
    "rcvd_rnr_err",
    "rcvd_seq_err",
    "rdma_recvs",
    "rdma_sends",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "send_err",
    "send_rnr_err",
    "sent_pkts",
)
LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "mlx5": {"counters": PMA_COUNTERS, "hw_counters": MLX5_HW_COUNTERS},
    "rxe": {"hw_counters": RXE_HW_COUNTERS},
}
LIFESPAN_MS = 10  # hw_counters/lifespan: how long the driver caches its counters (ms), not a count


def write_counters(root: str, device: str, port: int, layout: str) -> None:
    """Create the counter directories ``layout`` has (``mlx5`` or ``rxe``), every counter at 0."""
    for kind, names in LAYOUTS[layout].items():
        for name in names:
            put(os.path.join(port_path(root, device, port), kind, name),
                f"{LIFESPAN_MS if name == 'lifespan' else 0}\n")


def bump(root: str, device: str, port: int, kind: str, name: str, by: int) -> int:
    """Add ``by`` to one counter (as traffic would) and return its new value."""
    path = os.path.join(port_path(root, device, port), kind, name)
    with open(path) as f:
        value = int(f.read().strip()) + by
    put(path, f"{value}\n")
    return value
