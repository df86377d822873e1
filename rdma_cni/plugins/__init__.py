"""Policy: what each plugin does for each CNI verb (rdma-macvlan, rdma-multus)."""
