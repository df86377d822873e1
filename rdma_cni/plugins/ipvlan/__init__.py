"""rdma-ipvlan: TKE's shared RDMA NIC mode. Every pod shares every bond through a child link
(ipvlan, or macvlan with ``link: macvlan``) holding an address of its own from the bond's subnet.

Its own modules for what differs from rdma-macvlan: the config (:mod:`.config`, :mod:`.model`),
the address choice (:mod:`.pool`, a pure function), the per-bond transaction (:mod:`.tx`) and the
verbs (:mod:`.plugin`); the rest comes from the mechanisms (``net``, ``rdma``, ``state``).
"""
