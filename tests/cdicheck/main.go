// cdicheck: resolve CDI device IDs with the CDI library containerd 2.4.2 vendors
// (tags.cncf.io/container-device-interface v1.1.1, containerd/v2@v2.4.2 go.mod), the way the
// runtime injects a DRA driver's devices, and print what a container would get. tests/devices/test_cdi.py
// runs it against the specs rdma_cni/devices/cdi.py writes.
//
//	cdicheck SPEC_DIR ID...   exit 1 with the library's error when a spec or an ID is refused
package main

import (
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1]), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Println("cache:", err)
		os.Exit(1)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		fmt.Println("spec errors:", errs)
		os.Exit(1)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, os.Args[2:]...); err != nil {
		fmt.Println("inject:", unresolved, err)
		os.Exit(1)
	}
	for _, e := range spec.Process.Env {
		fmt.Println("env", e)
	}
	for _, d := range spec.Linux.Devices {
		fmt.Println("dev", d.Path, d.Type, d.Major, d.Minor)
	}
}
