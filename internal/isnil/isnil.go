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

// InError returns the first error of err's tree, in the order errors.Is
// walks it, that is a nil pointer, or nil if none is: a store's nil
// pointer returned as an error, whose methods may panic. It calls Unwrap
// on the errors that are not.
func InError(err error) error {
	for err != nil {
		if v := reflect.ValueOf(err); v.Kind() == reflect.Pointer && v.IsNil() {
			return err
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if n := InError(e); n != nil {
					return n
				}
			}
			return nil
		default:
			return nil
		}
	}
	return nil
}
