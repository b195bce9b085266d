// Package frameworks holds no code: its tests show package httplimit in
// front of handlers of chi, echo and gin, in a module of their own so that
// the library's go.mod stays free of them. See docs/http.md, "Frameworks".
package frameworks
