"""The demo (``scripts/demo``): a simulated GPU node in network namespaces, one RDMA pod through the
real plugins, and everything removed again.

Its steps follow TKE's guide, one module each, shared by the exclusive mode (rdma-macvlan:
:mod:`.exclusive`) and the shared mode (rdma-ipvlan and a shared pool: :mod:`.shared`):

1. the node, its bonds and RDMA devices (:mod:`.node`), the plugins, configs and tools installed on
   it (:mod:`.installed`; shared mode's in :mod:`.shared_node`);
2. the device plugin and what kubelet sees and admits (:mod:`.device_plugin`);
3. the pod, ADDed through rdma-multus (:mod:`.pod`);
4. inside the pod: interfaces, routes, GID indexes (:mod:`.inside_pod`);
5. traffic (:mod:`.traffic`);
6. what the node says: ``cni-tool state`` and ``doctor`` (:mod:`.node_says`);
7. delete, and the node compared with how it started (:mod:`.delete`).

The command line is :mod:`.command` (``python -m rdma_cni.cli.demo``); what every step uses to run
commands and show them is :mod:`.shell`.
"""
