"""A small, stdlib-only view of Kubernetes for a CNI plugin: kubeconfig, the Pod API, device checkpoints.

A CNI binary starts once per pod per verb, so it cannot afford a Kubernetes client library's import
time; it needs exactly one GET and one file read.

:mod:`~rdma_cni.kube.dirwatch` is the device plugin's: kubelet's device-plugins directory watched
with inotify (the ``inotify_simple`` package, imported only when a watch is opened).
"""
