"""The device model: what the node's RDMA devices are, below every front end that serves them (the
kubelet device plugin in :mod:`rdma_cni.deviceplugin`, the DRA driver to come).

Functions of sysfs, the dev root, netlink of the current netns and the plugins' attachment records,
tested without sockets:

- discovery (:mod:`.inventory`, :mod:`.hca`, :mod:`.pci`): bond <-> RDMA device, link layer, NUMA
  node, PCI address and PCIe root, char devices;
- the values one scan gives (:mod:`.model`) and whether each device may be handed out (:mod:`.health`);
- pools and selectors (:mod:`.pools`, :mod:`.selectors`) and the config forms that name them
  (:mod:`.config`: ours and TKE's ``mode: shared``; :mod:`.poolconf`: ``pools:`` and Mellanox's
  ``config.json``; errors in :mod:`.errors`);
- the allocation choice: which devices to prefer and what a container gets (:mod:`.allocation`,
  :mod:`.shared`).

Nothing here imports a front end or a CNI plugin.
"""
