"""The test cluster: Kubernetes, etcd and containerd built from Go modules, run in namespaces."""
