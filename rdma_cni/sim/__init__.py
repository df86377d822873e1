"""A simulated RDMA node for kernels without RDMA (tests, the demo).

* :mod:`rdma_cni.sim.tree` — build/edit a sysfs tree laid out like a real node's (``mlx5_bond_N`` over
  ``bondN``, GID tables, uverbs, ``ib_core`` netns mode).
* :mod:`rdma_cni.sim.model` — the kernel's GID slot rules seen in the lab; ``table_snapshot`` reads any
  tree (real or simulated) in one comparable form.
* :mod:`rdma_cni.sim.node` — ``SimNode``: follows live addresses of veth "bonds" and of macvlans in pod
  namespaces and keeps the tree's GID tables in sync.
* :mod:`rdma_cni.sim.daemon` — runs one in a thread, or as a process (``python -m rdma_cni.sim.daemon``).
* :mod:`rdma_cni.sim.sync` — waits until it has seen a new pod netns or every event so far.
* :mod:`rdma_cni.sim.fixture` — turn a sysfs capture of a real node into a live-looking tree.
"""
