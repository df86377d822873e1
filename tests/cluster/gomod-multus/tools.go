//go:build tools

// Package tools pins upstream Multus's main packages (thin plugin, thick shim and daemon, the
// DaemonSet's installer and entrypoint, and the passthru plugin the installer copies), so that
// go mod tidy keeps what they need in go.sum.
package tools

import (
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/install_multus"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni"
	_ "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint"
)
