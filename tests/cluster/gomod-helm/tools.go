//go:build tools

// Package tools pins helm's command as a dependency of this module, so that `go build
// helm.sh/helm/v4/cmd/helm` here builds exactly the version go.mod requires.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
