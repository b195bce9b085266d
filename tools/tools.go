//go:build tools

// Package tools pins the versions of the development tools, apart from the
// library's go.mod: go run honnef.co/go/tools/cmd/staticcheck from here.
package tools

import _ "honnef.co/go/tools/cmd/staticcheck"
