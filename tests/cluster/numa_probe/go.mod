// numa_probe: cadvisor's own sysfs topology code (the version kubelet v1.37.2 builds with, per
// k8s.io/kubernetes v1.37.2's go.mod) run against a sysfs tree; tests/cluster/test_cluster_gpu_plugin.py
// checks tests/cluster/numa_tree.py's fake NUMA nodes with it.
module rdma-cni.test/numaprobe

go 1.25.0

require github.com/google/cadvisor/lib v0.60.5

require (
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
)

// The versions k8s.io/kubernetes v1.37.2 builds kubelet with (MVS there picks these over cadvisor's).
require (
	golang.org/x/sys v0.47.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
