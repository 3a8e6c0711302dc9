// Package wire holds what the wire packages (wire/openai, wire/anthropic,
// wire/responses, wire/gemini, wire/flat) share: the Dialect each exports,
// a request body read in place (Spliced) and rewritten by splice, server-sent
// events, a JSON object kept as ordered raw fields so unknown fields pass
// through byte-stable, and the upstream error with its classification.
// Wires translate; they do not decide.
package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Field is one member of a JSON object, its value kept as raw bytes.
type Field struct {
	Key   string
	Value json.RawMessage
}

// Object is a JSON object as ordered raw fields: re-encoding it reproduces
// every value byte for byte, in the original order.
type Object []Field

// ParseObject reads a JSON object without interpreting its values.
func ParseObject(b []byte) (Object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	var o Object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("field %q: %w", key, err)
		}
		o = append(o, Field{Key: key, Value: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after the JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data after the JSON object")
	}
	return o, nil
}

// Get returns the raw value of key.
func (o Object) Get(key string) (json.RawMessage, bool) {
	for _, f := range o {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

// Set replaces the value of key in place, or appends it.
func (o *Object) Set(key string, v json.RawMessage) {
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Value = v
			return
		}
	}
	*o = append(*o, Field{Key: key, Value: v})
}

// Delete removes key.
func (o *Object) Delete(key string) {
	for i := range *o {
		if (*o)[i].Key == key {
			*o = append((*o)[:i], (*o)[i+1:]...)
			return
		}
	}
}

// MarshalJSON writes the fields in order, values verbatim, into one
// allocation of the exact size.
func (o Object) MarshalJSON() ([]byte, error) {
	n := 2
	for _, f := range o {
		n += len(f.Key) + len(f.Value) + 8
	}
	var b bytes.Buffer
	b.Grow(n)
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k := Quote(f.Key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(f.Value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Extra returns the fields of o whose keys are not in known, or nil.
func (o Object) Extra(known ...string) map[string]json.RawMessage {
	var out map[string]json.RawMessage
outer:
	for _, f := range o {
		for _, k := range known {
			if f.Key == k {
				continue outer
			}
		}
		if out == nil {
			out = map[string]json.RawMessage{}
		}
		out[f.Key] = f.Value
	}
	return out
}

// Kind classifies an upstream error by what the engine does about it.
type Kind string

const (
	PromptTooLong   Kind = "prompt_too_long"   // the window is full: evict images, then compact
	RateLimited     Kind = "rate_limited"      // 429: retry after a while
	Overloaded      Kind = "overloaded"        // 529 / 503: retry after a while
	InvalidImage    Kind = "invalid_image"     // the provider refused an image
	RequestTooLarge Kind = "request_too_large" // 413: the body is over the provider's cap
	Auth            Kind = "auth"              // 401 / 403: never retried
	BadRequest      Kind = "bad_request"       // any other 4xx: never retried
	Server          Kind = "server"            // 5xx: retry
)

// Error is an upstream error in a provider's own shape, classified.
type Error struct {
	Kind       Kind
	Status     int
	Type       string // the provider's error type or code
	Message    string
	RetryAfter time.Duration // from the Retry-After header, when present
	Body       []byte        // the provider's JSON, to pass through unchanged
	Header     http.Header   `json:"-"` // the provider's response headers (request id, rate limits), when known
}

func (e *Error) Error() string {
	return fmt.Sprintf("upstream %d %s: %s", e.Status, e.Kind, e.Message)
}

// Retryable reports whether sending the same request again may succeed.
func (e *Error) Retryable() bool {
	return e.Kind == RateLimited || e.Kind == Overloaded || e.Kind == Server
}

// RetryAfter parses a Retry-After header (seconds or an HTTP date).
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// KindForStatus is the classification of a status when the body says
// nothing more specific.
func KindForStatus(status int) Kind {
	switch {
	case status == 401 || status == 403:
		return Auth
	case status == 413:
		return RequestTooLarge
	case status == 429:
		return RateLimited
	case status == 529 || status == 503:
		return Overloaded
	case status >= 500:
		return Server
	}
	return BadRequest
}

// WriteString writes s as a JSON string. A string that needs no escaping —
// base64 and data URLs always — is written as is (into a BodyWriter, a
// large one as its own piece, not copied at all); encoding/json would scan
// and copy a multi-megabyte image several times.
func WriteString(w JSONWriter, s string) {
	if !plainString(s) {
		q := Quote(s)
		w.Write(q)
		return
	}
	w.WriteByte('"')
	writeBig(w, s)
	w.WriteByte('"')
}

// WriteDataURL writes a data URL as a JSON string. b64 must be standard
// base64, which needs no escaping: megabytes of it are written as they are,
// as a piece of their own when w is a BodyWriter.
func WriteDataURL(w JSONWriter, mediaType, b64 string) {
	w.WriteString(`"data:`)
	if plainString(mediaType) {
		w.WriteString(mediaType)
	} else {
		q := Quote(mediaType)
		w.Write(q[1 : len(q)-1])
	}
	w.WriteString(";base64,")
	writeBig(w, b64)
	w.WriteByte('"')
}

// WriteBase64 writes standard base64 as a JSON string, as it is (it needs
// no escaping), as a piece of its own when w is a BodyWriter.
func WriteBase64(w JSONWriter, b64 string) {
	w.WriteByte('"')
	writeBig(w, b64)
	w.WriteByte('"')
}

func writeBig(w JSONWriter, s string) {
	if bw, ok := w.(*BodyWriter); ok {
		bw.Big(s)
	} else {
		w.WriteString(s)
	}
}

// plainString reports whether s holds no byte JSON must escape (control
// characters, '"', '\\') and no non-ASCII byte, eight bytes at a time.
func plainString(s string) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	hasZero := func(x uint64) bool { return (x-ones)&^x&highs != 0 }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64([]byte(s[i : i+8]))
		if x&highs != 0 || hasZero(x&0xE0E0E0E0E0E0E0E0) || hasZero(x^0x2222222222222222) || hasZero(x^0x5C5C5C5C5C5C5C5C) {
			return false
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// RequestHead is what every chat request has at its top level: its fields
// in order, the model, the stream flag and the raw messages.
type RequestHead struct {
	Top      Object
	Model    string
	Stream   bool
	Messages []json.RawMessage
}

// ParseRequestHead reads a request's top level; the codecs read the rest.
func ParseRequestHead(b []byte) (RequestHead, error) {
	top, err := ParseObject(b)
	if err != nil {
		return RequestHead{}, fmt.Errorf("request body: %w", err)
	}
	h := RequestHead{Top: top}
	if v, ok := top.Get("model"); ok {
		if err := json.Unmarshal(v, &h.Model); err != nil {
			return RequestHead{}, fmt.Errorf("model: %w", err)
		}
	}
	if v, ok := top.Get("stream"); ok {
		_ = json.Unmarshal(v, &h.Stream)
	}
	raw, ok := top.Get("messages")
	if !ok {
		return RequestHead{}, errors.New("request has no messages")
	}
	if err := json.Unmarshal(raw, &h.Messages); err != nil {
		return RequestHead{}, fmt.Errorf("messages: %w", err)
	}
	return h, nil
}

// StringContent reads message content that both formats allow as a plain
// string: it returns the string and true, or ok false when the content is
// absent or null (empty is true) or something else, an array, for the
// caller to read.
func StringContent(raw json.RawMessage) (s string, ok, empty bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, true, nil
	}
	if raw[0] != '"' {
		return "", false, false, nil
	}
	err = json.Unmarshal(raw, &s)
	return s, err == nil, false, err
}

// ExtraOf returns the fields of the JSON object raw whose keys are not in
// known, as a JSON object in their original order ("" when there are none):
// the opaque Extra of a part.
func ExtraOf(raw json.RawMessage, known ...string) string {
	o, err := ParseObject(raw)
	if err != nil {
		return ""
	}
	var extra Object
outer:
	for _, f := range o {
		for _, k := range known {
			if f.Key == k {
				continue outer
			}
		}
		extra = append(extra, f)
	}
	if len(extra) == 0 {
		return ""
	}
	b, _ := extra.MarshalJSON()
	return string(b)
}

// WriteExtra writes the members of the JSON object extra, each preceded by
// a comma, so they join an object being written; "" writes nothing.
func WriteExtra(b JSONWriter, extra string) {
	if len(extra) > 2 && extra[0] == '{' && extra[len(extra)-1] == '}' {
		b.WriteByte(',')
		b.WriteString(extra[1 : len(extra)-1])
	}
}
