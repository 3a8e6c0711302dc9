// Package jsonspan reads JSON as spans of the bytes it came in: where each
// value starts and ends, without decoding or copying it. The gateway finds
// messages and image parts of a request with one forward scan and copies
// everything else as slices, so what imgctx does not manage reaches the
// upstream byte for byte, pretty-printed or compact. Valid, and every walk,
// validates as strictly as encoding/json's json.Valid (a fuzz target holds
// it to that), except a value read with EndBase64, whose contents its
// caller's base64 decoder checks (or Check, when it does not decode them).
package jsonspan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
)

// SyntaxError says where a body stops being JSON.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

func bad(i int, msg string) error { return &SyntaxError{Offset: i, Msg: msg} }

// maxDepth bounds nesting, so a hostile body cannot exhaust the stack
// (encoding/json allows 10,000).
const maxDepth = 10000

// Skip returns the offset after the whitespace at b[i:].
func Skip(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// End returns the offset just past the value that starts at b[vs],
// validating it: what an Object or Array callback returns for a value it
// does not read.
func End(b []byte, vs int) (int, error) { return value(b, vs, 0) }

func value(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return i, bad(i, "unexpected end of input")
	}
	switch c := b[i]; {
	case c == '"':
		return str(b, i)
	case c == '{':
		if depth >= maxDepth {
			return i, bad(i, "nested too deeply")
		}
		return object(b, i, depth, nil)
	case c == '[':
		if depth >= maxDepth {
			return i, bad(i, "nested too deeply")
		}
		return array(b, i, depth, nil)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return number(b, i)
	}
	return i, bad(i, fmt.Sprintf("unexpected character %q", b[i]))
}

// Object walks the object at b[i] (b[i] must be '{'), calling fn with each
// member's key (its raw bytes between the quotes, escapes decoded when it
// has any) and the offset where its value starts. fn reads the value — or
// skips it with End — and returns the offset just past it, so every byte
// is scanned once however deep the caller descends. Object returns the
// offset after '}'.
// What fn does not read it must skip with End, so the walk validates every
// byte exactly as Valid does, and only once.
func Object(b []byte, i int, fn func(key []byte, vs int) (int, error)) (int, error) {
	return object(b, i, 0, fn)
}

func object(b []byte, i, depth int, fn func(key []byte, vs int) (int, error)) (int, error) {
	if i >= len(b) || b[i] != '{' {
		return i, bad(i, "expected an object")
	}
	i = Skip(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, bad(i, "expected a member name")
		}
		ke, err := str(b, i)
		if err != nil {
			return ke, err
		}
		key := b[i+1 : ke-1]
		if hasEscape(key) {
			var s string
			if err := json.Unmarshal(b[i:ke], &s); err != nil {
				return i, bad(i, "bad member name")
			}
			key = []byte(s)
		}
		i = Skip(b, ke)
		if i >= len(b) || b[i] != ':' {
			return i, bad(i, "expected ':' after a member name")
		}
		vs := Skip(b, i+1)
		if vs >= len(b) {
			return vs, bad(vs, "unexpected end of input")
		}
		var ve int
		if fn != nil {
			ve, err = fn(key, vs)
		} else {
			ve, err = value(b, vs, depth+1)
		}
		if err != nil {
			return ve, err
		}
		i = Skip(b, ve)
		if i >= len(b) {
			return i, bad(i, "unexpected end of input in an object")
		}
		switch b[i] {
		case ',':
			i = Skip(b, i+1)
		case '}':
			return i + 1, nil
		default:
			return i, bad(i, "expected ',' or '}' in an object")
		}
	}
}

// Array walks the array at b[i] (b[i] must be '['), calling fn with the
// offset where each element starts; fn returns the offset just past it, as
// with Object. Array returns the offset after ']'.
func Array(b []byte, i int, fn func(vs int) (int, error)) (int, error) {
	return array(b, i, 0, fn)
}

// ArrayFrom is Array resumed just past an element that ends at from,
// inside the array at b[i]: the elements before are taken as read (a
// caller that saw these very bytes before, say). from 0 is Array.
func ArrayFrom(b []byte, i, from int, fn func(vs int) (int, error)) (int, error) {
	return arrayFrom(b, i, from, 0, fn)
}

func array(b []byte, i, depth int, fn func(vs int) (int, error)) (int, error) {
	return arrayFrom(b, i, 0, depth, fn)
}

func arrayFrom(b []byte, i, from, depth int, fn func(vs int) (int, error)) (int, error) {
	if i >= len(b) || b[i] != '[' {
		return i, bad(i, "expected an array")
	}
	resumed := from > i && from <= len(b)
	if resumed {
		i = from
	} else if i = Skip(b, i+1); i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		if !resumed {
			if i >= len(b) {
				return i, bad(i, "unexpected end of input in an array")
			}
			var ve int
			var err error
			if fn != nil {
				ve, err = fn(i)
			} else {
				ve, err = value(b, i, depth+1)
			}
			if err != nil {
				return ve, err
			}
			i = ve
		}
		resumed = false
		i = Skip(b, i)
		if i >= len(b) {
			return i, bad(i, "unexpected end of input in an array")
		}
		switch b[i] {
		case ',':
			i = Skip(b, i+1)
		case ']':
			return i + 1, nil
		default:
			return i, bad(i, "expected ',' or ']' in an array")
		}
	}
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, bad(i, "invalid literal")
	}
	return i + len(lit), nil
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func number(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return i, bad(start, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return i, bad(start, "invalid number")
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, bad(start, "invalid number")
		}
		i = j
	}
	return i, nil
}

// str returns the offset after the string at b[i] (b[i] is '"'), checking
// it as encoding/json does. Runs of plain bytes go eight at a time (a
// word-at-a-time test for '"', '\\' and control characters); text dense
// with escapes goes byte by byte through a table.
func str(b []byte, i int) (int, error) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	const quotes, slashes, ctl = 0x2222222222222222, 0x5C5C5C5C5C5C5C5C, 0xE0E0E0E0E0E0E0E0
	start := i
	i++
	for {
		// The lowest set bit of the test is exact (only bytes above the
		// first match can be flagged falsely), so it lands on the byte.
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			q, s, c := x^quotes, x^slashes, x&ctl
			if m := ((q-ones)&^q | (s-ones)&^s | (c-ones)&^c) & highs; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && !special[b[i]] {
			i++
		}
		if i >= len(b) {
			return len(b), bad(start, "unterminated string")
		}
		switch b[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 < len(b) && short[b[i+1]] { // \n, \", … : the common case, inline
				i += 2
				continue
			}
			n, err := escape(b, i)
			if err != nil {
				return i, err
			}
			i += n
		default:
			return i, bad(i, "control character in a string")
		}
	}
}

// short marks the letters of two-byte escapes.
var short = func() (t [256]bool) {
	for _, c := range `"\\/bfnrt` {
		t[c] = true
	}
	return t
}()

// special marks the bytes that end a plain run inside a string.
var special = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// EndBase64 is End for a value that should be a string of base64 (or a
// data URL): megabytes the caller decodes and so checks itself. Its end is
// found, but its bytes are not checked; Check does that when the caller
// does not decode it after all.
//
// Escapes are not checked either, only skipped right: a string that has
// any is decoded by String, which checks them.
func EndBase64(b []byte, vs int) (int, error) {
	if vs >= len(b) || b[vs] != '"' {
		return End(b, vs)
	}
	for i := vs + 1; ; {
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			return len(b), bad(vs, "unterminated string")
		}
		q := i + k
		n := 0 // backslashes right before the quote: an odd run escapes it
		for q-1-n > vs && b[q-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		i = q + 1
	}
}

// Check validates the value at b[vs:ve] in full: what a value found with
// EndBase64 needs when the caller does not decode it after all.
func Check(b []byte, vs, ve int) error {
	end, err := value(b, vs, 0)
	if err == nil && end != ve {
		err = bad(end, "value ends early")
	}
	return err
}

// escape checks the escape sequence at b[i] ('\\') and returns its length.
func escape(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return 0, bad(i, "unterminated escape")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if i+6 > len(b) {
			return 0, bad(i, "short \\u escape")
		}
		for _, c := range b[i+2 : i+6] {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return 0, bad(i, "bad \\u escape")
			}
		}
		return 6, nil
	}
	return 0, bad(i, "bad escape")
}

func hasEscape(s []byte) bool { return bytes.IndexByte(s, '\\') >= 0 }

// String decodes the JSON string at b[vs:ve]. Without escapes it is a
// plain conversion; ok is false when the span is not a string.
func String(b []byte, vs, ve int) (s string, ok bool) {
	if ve-vs < 2 || b[vs] != '"' || b[ve-1] != '"' {
		return "", false
	}
	inner := b[vs+1 : ve-1]
	if !hasEscape(inner) {
		return string(inner), true
	}
	if json.Unmarshal(b[vs:ve], &s) != nil {
		return "", false
	}
	return s, true
}
