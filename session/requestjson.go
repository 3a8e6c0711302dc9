package session

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// appendRequest appends r as json.Marshal writes it, byte for byte, with
// no reflection: the request log encodes a line per request, and
// json.Marshal was a fifth of the log's CPU under load. The field order,
// the omitempty rules and the escaping are encoding/json's; a property test
// holds the two together.
func appendRequest(b []byte, r *Request) ([]byte, error) {
	o := object{b: b}
	o.str("id", r.ID, false)
	o.str("upstream_id", r.UpstreamID, true)
	o.key("time")
	o.b = append(o.b, '"')
	o.b = r.Time.AppendFormat(o.b, time.RFC3339Nano)
	o.b = append(o.b, '"')
	o.str("tenant", r.Tenant, false)
	o.str("conversation", r.Conversation, true)
	o.str("route", r.Route, false)
	o.str("wire", r.Wire, true)
	o.str("model", r.Model, true)
	o.str("profile", r.Profile, true)
	o.str("upstream", r.Upstream, true)
	o.int("status", int64(r.Status), false)
	o.float("duration_ms", r.DurationMS, false)
	o.float("gateway_ms", r.GatewayMS, true)
	o.float("first_byte_ms", r.FirstByteMS, true)
	o.int("input_tokens", int64(r.Input), false)
	o.int("cache_read_tokens", int64(r.CacheRead), false)
	o.int("cache_write_tokens", int64(r.CacheWrite), false)
	o.int("output_tokens", int64(r.Output), false)
	o.float("dollars", r.Dollars, false)
	o.bool("priced", r.Priced, false)
	o.int("bytes_in", r.BytesIn, false)
	o.int("bytes_out", r.BytesOut, false)
	o.int("window", int64(r.Window), true)
	if len(r.Images) > 0 {
		o.key("images")
		o.b = append(o.b, '[')
		for i := range r.Images {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			im := &r.Images[i]
			e := object{b: o.b}
			e.str("ref", im.Ref.String(), false)
			e.int("msg", int64(im.Msg), false)
			e.bool("sent", im.Sent, false)
			e.str("keep", im.Keep, true)
			e.str("reason", string(im.Reason), true)
			e.str("caption", im.Caption, true)
			e.int("width", int64(im.Width), true)
			e.int("height", int64(im.Height), true)
			e.int("tokens", int64(im.Tokens), true)
			o.b = e.close()
		}
		o.b = append(o.b, ']')
	}
	o.int("outline_from", int64(r.OutlineFrom), true)
	if len(r.Outline) > 0 {
		o.key("outline")
		o.b = append(o.b, '[')
		for i, f := range r.Outline {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			e := object{b: o.b}
			e.str("role", f.Role, false)
			e.int("bytes", int64(f.Bytes), false)
			o.b = e.close()
		}
		o.b = append(o.b, ']')
	}
	o.int("removed", int64(r.Removed), true)
	o.bool("prefix_break", r.Break, true)
	o.str("break_cause", r.BreakCause, true)
	o.int("replays", int64(r.Replays), true)
	o.str("error", r.Error, true)
	return o.close(), o.err
}

// object writes one JSON object's members; the first member opens it.
type object struct {
	b      []byte
	opened bool
	err    error
}

func (o *object) key(k string) {
	if o.opened {
		o.b = append(o.b, ',')
	} else {
		o.b = append(o.b, '{')
		o.opened = true
	}
	o.b = append(append(append(o.b, '"'), k...), '"', ':')
}

func (o *object) close() []byte {
	if !o.opened {
		return append(o.b, '{', '}')
	}
	return append(o.b, '}')
}

func (o *object) str(k, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	o.key(k)
	if !plain(v) {
		q, _ := json.Marshal(v) // a string always encodes
		o.b = append(o.b, q...)
		return
	}
	o.b = append(append(append(o.b, '"'), v...), '"')
}

func (o *object) int(k string, v int64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

func (o *object) bool(k string, v, omitEmpty bool) {
	if omitEmpty && !v {
		return
	}
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

// float writes v as encoding/json does: 'f' form between 1e-6 and 1e21,
// else 'e' with a two-digit exponent cut to one ("1e-07" → "1e-7"); NaN
// and infinities are an error, as they are to json.Marshal.
func (o *object) float(k string, v float64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		if o.err == nil {
			o.err = fmt.Errorf("request log line: %s is %v, not a JSON number", k, v)
		}
		return
	}
	o.key(k)
	form := byte('f')
	if a := math.Abs(v); a != 0 && (a < 1e-6 || a >= 1e21) {
		form = 'e'
	}
	o.b = strconv.AppendFloat(o.b, v, form, -1, 64)
	if n := len(o.b); form == 'e' && n >= 4 && o.b[n-4] == 'e' && o.b[n-3] == '-' && o.b[n-2] == '0' {
		o.b[n-2] = o.b[n-1]
		o.b = o.b[:n-1]
	}
}

// plain reports whether json.Marshal writes s as it is between quotes:
// printable ASCII but for the quote, the backslash and the three it
// escapes for HTML (<, >, &).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20, c >= 0x80, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
