"""rdma-multus: the Multus-style meta plugin. It reads a pod's networks annotation and runs one
delegate per network, in order on ADD and in reverse on DEL.

The verbs in :mod:`.plugin`; its config (:mod:`.config`), the annotation (:mod:`.networks`), the
pod it reads it from (:mod:`.pod`), the NetworkAttachmentDefinitions (:mod:`.nad`), the delegate
calls (:mod:`.delegates`), what an ADD ran, kept for DEL (:mod:`.plan`), and the network-status
annotation it writes back (:mod:`.status`).
"""
