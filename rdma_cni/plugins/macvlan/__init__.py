"""rdma-macvlan: TKE's exclusive RDMA NIC mode. A pod gets whole bonds: a macvlan on each, the bond's
IP address and routes moved from the host into the pod (so its RoCE GID keeps the host's index), and
given back exactly on DEL.

The verbs in :mod:`.plugin`; its config (:mod:`.config`, :mod:`.model`), which bonds a pod gets
(:mod:`.select`), the per-bond transaction (:mod:`.tx`) and its RDMA steps (:mod:`.rdma`); the rest
comes from the mechanisms (``net``, ``rdma``, ``state``, ``delegate_config``).
"""
