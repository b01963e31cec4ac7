package scratch

import (
	"reflect"
	"unsafe"
)

// span is the memory [lo, hi) of a slice's elements, up to its capacity.
type span struct{ lo, hi uintptr }

func spanOf[T any](s []T) span {
	if cap(s) == 0 {
		return span{}
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	return span{p, p + uintptr(cap(s))*unsafe.Sizeof(s[:1][0])}
}

func overlaps(s span, live []span) bool {
	for _, l := range live {
		if s.lo < l.hi && l.lo < s.hi {
			return true
		}
	}
	return false
}

// spans appends the span of every []T reachable from v (struct fields,
// arrays, slices of other element types, map values; not through pointers
// or interfaces) to live.
func spans[T any](v reflect.Value, live []span) []span {
	switch v.Kind() {
	case reflect.Slice:
		if v.Type().Elem() == reflect.TypeFor[T]() {
			if v.Cap() > 0 {
				p := v.Pointer()
				live = append(live, span{p, p + uintptr(v.Cap())*v.Type().Elem().Size()})
			}
			return live
		}
		if !composite(v.Type().Elem().Kind()) {
			return live
		}
		for i := range v.Len() {
			live = spans[T](v.Index(i), live)
		}
	case reflect.Array:
		for i := range v.Len() {
			live = spans[T](v.Index(i), live)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			live = spans[T](v.Field(i), live)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			live = spans[T](it.Value(), live)
		}
	}
	return live
}

// composite reports whether a value of kind k may hold a slice without
// going through a pointer.
func composite(k reflect.Kind) bool {
	return k == reflect.Slice || k == reflect.Array || k == reflect.Struct || k == reflect.Map
}
