// Package isnil tells a nil interface value from one holding a nil
// pointer, map, slice, func or channel: a store or an observer whose
// constructor failed, kept instead of its error.
package isnil

import "reflect"

// Is reports whether v is nil, or holds a nil pointer (or map, slice,
// func or channel) of its type.
func Is(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
