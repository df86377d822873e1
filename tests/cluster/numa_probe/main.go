// Command numa_probe prints, as JSON, the NUMA topology that cadvisor's machine.GetTopology reads
// from sysfs: the same call kubelet's cadvisor makes for MachineInfo.Topology, from which kubelet's
// topology manager learns its NUMA nodes. It reads the real paths (/sys/devices/system/node/,
// /sys/devices/system/cpu/); a test runs it inside a private mount namespace with a fake node tree
// bind-mounted over /sys/devices/system/node, or links it with
// -X github.com/google/cadvisor/lib/utils/sysfs.nodeDir=<tree>/ to read a tree elsewhere.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/google/cadvisor/lib/machine"
	"github.com/google/cadvisor/lib/utils/sysfs"
)

type result struct {
	Nodes    any    `json:"nodes"`
	NumCores int    `json:"num_cores"`
	Error    string `json:"error,omitempty"`
}

func main() {
	nodes, cores, err := machine.GetTopology(sysfs.NewRealSysFs())
	out := result{Nodes: nodes, NumCores: cores}
	if err != nil {
		out.Error = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if out.Error != "" {
		os.Exit(1)
	}
}
