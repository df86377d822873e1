//go:build tools

// Package tools pins go-containerregistry's main packages, so that go mod tidy keeps what they need in go.sum.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
	_ "github.com/google/go-containerregistry/cmd/registry"
)
