// Package media handles untrusted image and document bytes: data URLs and
// base64 in any common dialect, format sniffing by magic bytes, dimensions
// from the header alone, size and pixel limits (checked before anything is
// decoded), shrinking on demand, SSRF-safe URL fetching, and MIME strings
// made safe for markers.
//
// Every refusal is a *reason.Error whose code is one of invalid, too_large
// or fetch_failed. Nothing here knows about conversations.
package media

import (
	"bytes"
	"encoding/base64"
	"strings"

	"github.com/imgctx/imgctx/reason"
)

// Character classes of the tolerant base64 decoder.
const (
	b64Invalid = iota
	b64Common  // A-Z a-z 0-9
	b64Std     // + /
	b64URL     // - _
	b64Pad     // =
	b64Space   // ASCII white space
)

var b64Class = func() (t [256]uint8) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c], t[c+'a'-'A'] = b64Common, b64Common
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = b64Common
	}
	t['+'], t['/'], t['-'], t['_'], t['='] = b64Std, b64Std, b64URL, b64URL, b64Pad
	for _, c := range " \t\r\n\f\v" {
		t[c] = b64Space
	}
	return t
}()

// DecodeBase64 decodes base64 written with the standard or the URL-safe
// alphabet, with or without padding, with white space and line breaks
// anywhere. Mixed alphabets, padding in the middle, a truncated final group
// and characters outside the alphabet are refused with reason invalid.
func DecodeBase64(s string) ([]byte, error) {
	// The common case — standard alphabet, padded, maybe line-wrapped (the
	// standard decoder skips \r and \n) — needs no pass of ours.
	if len(s) > 0 && len(s)%4 == 0 {
		if out, err := base64.StdEncoding.DecodeString(s); err == nil {
			return out, nil
		}
	}
	return decodeTolerant(s)
}

// DecodeBase64Bytes is DecodeBase64 for base64 already in a byte slice (a
// span of a request body): the common case decodes without copying it. It
// also reports whether b is exactly the padded standard encoding of what it
// decodes to, with no line breaks, so a caller may send that text again
// instead of encoding the bytes anew.
func DecodeBase64Bytes(b []byte) (data []byte, canonical bool, err error) {
	if len(b) > 0 && len(b)%4 == 0 {
		out := make([]byte, base64.StdEncoding.DecodedLen(len(b)))
		if n, err := base64.StdEncoding.Decode(out, b); err == nil {
			return out[:n], sameEncoding(out[:n], b), nil
		}
	}
	data, err = decodeTolerant(string(b))
	return data, false, err
}

// sameEncoding reports whether b, which the standard decoder turned into
// data, is exactly data's standard encoding. The decoder skips \r and \n
// (so the length must match) and ignores the unused bits of a padded final
// group (so that group is encoded again and compared).
func sameEncoding(data, b []byte) bool {
	if base64.StdEncoding.EncodedLen(len(data)) != len(b) {
		return false
	}
	if len(data)%3 == 0 {
		return true
	}
	var last [4]byte
	base64.StdEncoding.Encode(last[:], data[len(data)-len(data)%3:])
	return bytes.Equal(last[:], b[len(b)-4:])
}

func decodeTolerant(s string) ([]byte, error) {
	// A branch-free pass collects which classes occur; the rare cases
	// (white space, padding, errors) are handled after it.
	var classes uint8
	for i := 0; i < len(s); i++ {
		classes |= 1 << b64Class[s[i]]
	}
	if classes&(1<<b64Invalid) != 0 {
		return nil, reason.New(reason.Invalid, "character outside the base64 alphabet")
	}
	if classes&(1<<b64Std) != 0 && classes&(1<<b64URL) != 0 {
		return nil, reason.New(reason.Invalid, "base64 mixes the standard and URL-safe alphabets")
	}
	var clean []byte
	if classes&(1<<b64Space) != 0 {
		clean = make([]byte, 0, len(s))
		for i := 0; i < len(s); i++ {
			if b64Class[s[i]] != b64Space {
				clean = append(clean, s[i])
			}
		}
	} else {
		clean = []byte(s)
	}
	if len(clean) == 0 {
		return nil, reason.New(reason.Invalid, "empty base64")
	}
	body := bytes.TrimRight(clean, "=")
	pads := len(clean) - len(body)
	if bytes.IndexByte(body, '=') >= 0 {
		return nil, reason.New(reason.Invalid, "base64 padding before the end")
	}
	if pads > 2 || (pads > 0 && len(clean)%4 != 0) {
		return nil, reason.New(reason.Invalid, "malformed base64 padding")
	}
	if len(body)%4 == 1 {
		return nil, reason.New(reason.Invalid, "truncated base64 (a final group of one character)")
	}
	enc := base64.RawStdEncoding
	if classes&(1<<b64URL) != 0 {
		enc = base64.RawURLEncoding
	}
	out := make([]byte, enc.DecodedLen(len(body)))
	n, err := enc.Decode(out, body)
	if err != nil {
		return nil, reason.Wrap(reason.Invalid, "undecodable base64", err)
	}
	return out[:n], nil
}

// DataURL is a parsed "data:" URL.
type DataURL struct {
	MediaType string // declared type, lower case, parameters removed; "" when absent
	Data      []byte
}

// ParseDataURL decodes "data:[<type>][;param=value]*[;base64],<data>".
// Percent-encoded (non-base64) data URLs are accepted too.
func ParseDataURL(s string) (DataURL, error) {
	rest, ok := cutPrefixFold(strings.TrimSpace(s), "data:")
	if !ok {
		return DataURL{}, reason.New(reason.Invalid, "not a data URL")
	}
	meta, payload, ok := strings.Cut(rest, ",")
	if !ok {
		return DataURL{}, reason.New(reason.Invalid, "data URL without a comma")
	}
	params := strings.Split(meta, ";")
	isB64 := false
	if n := len(params); n > 1 && strings.EqualFold(strings.TrimSpace(params[n-1]), "base64") {
		isB64 = true
		params = params[:n-1]
	}
	mt := strings.ToLower(strings.TrimSpace(params[0]))
	var data []byte
	var err error
	if isB64 {
		data, err = DecodeBase64(payload)
	} else {
		data, err = percentDecode(payload)
	}
	if err != nil {
		return DataURL{}, err
	}
	return DataURL{MediaType: mt, Data: data}, nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

func percentDecode(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			out = append(out, c)
			continue
		}
		if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
			return nil, reason.New(reason.Invalid, "malformed percent escape in data URL")
		}
		out = append(out, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
		i += 2
	}
	return out, nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
