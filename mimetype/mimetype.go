// Package mimetype makes MIME type strings safe to show a model. MIME types
// arrive from tools, clients and servers, none of them trusted, and end up
// inside markers and placeholders the model reads. Standard library only.
package mimetype

import "strings"

// OctetStream is what Sanitize returns for anything it cannot trust.
const OctetStream = "application/octet-stream"

// Sanitize returns a MIME type safe to embed in a marker the model reads:
// lower case, parameters dropped, exactly "type/subtype" of restricted
// characters, each side at most 63 characters. Anything else (control
// characters, brackets, quotes, spaces inside, over-long values, no slash)
// becomes application/octet-stream. MIME strings from tools are untrusted.
func Sanitize(s string) string {
	if len(s) > 256 {
		return OctetStream
	}
	s, _, _ = strings.Cut(s, ";")
	s = strings.ToLower(strings.TrimSpace(s))
	typ, sub, ok := strings.Cut(s, "/")
	if !ok || !mimeToken(typ) || !mimeToken(sub) {
		return OctetStream
	}
	return s
}

// mimeToken accepts RFC 6838 restricted-name characters.
func mimeToken(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		if i == 0 && !alnum {
			return false
		}
		if !alnum && !strings.ContainsRune("!#$&^_.+-", rune(c)) {
			return false
		}
	}
	return true
}
