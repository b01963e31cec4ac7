package hw

import (
	"fmt"
	"reflect"
	"strings"
)

// bound is the physical range of one numeric field of a device or cluster
// file: a finite value in [lo, hi], in unit. Each range is wider than any
// part announced, so that it refuses only values that are no hardware (a
// latency of 1e300 µs, a link of 1e-300 GB/s) and would otherwise print a
// 300-digit step time or an infinite one.
type bound struct {
	field  string
	v      float64
	lo, hi float64
	unit   string
}

// check returns the error naming the field, its value and its range, or nil.
func (b bound) check() error {
	if b.v >= b.lo && b.v <= b.hi { // false for NaN
		return nil
	}
	return fmt.Errorf("%s = %v: must be in [%g, %g] %s", b.field, b.v, b.lo, b.hi, b.unit)
}

// checkBounds returns the error of every bound its value is outside.
func checkBounds(bs []bound) []error {
	var errs []error
	for _, b := range bs {
		if err := b.check(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// requiredFields are the JSON names of t's fields whose tag lacks
// omitempty: a document must give each of them, since a missing number
// would otherwise silently be 0.
func requiredFields(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" || strings.Contains(","+opts+",", ",omitempty,") {
			continue
		}
		names = append(names, name)
	}
	return names
}
