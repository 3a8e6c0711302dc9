package wire

import (
	"strings"
	"testing"
)

// An image part's URL read in place: a data URL's media type without its
// parameters, its base64 a span of the body; an imgctx: ref by ref;
// another URL as the URL; not a string, no slot; a control byte in a
// data URL's head (which goes upstream as it came), an error.
func TestURLSlot(t *testing.T) {
	for _, c := range []struct {
		in, via, mediaType, data, url, err string
		ok                                 bool
	}{
		{in: `"data:image/png;base64,iVBORw0K"`, ok: true, via: "base64", mediaType: "image/png", data: "iVBORw0K"},
		{in: `"data:image/png;name=shot.png;base64,iVBORw0K"`, ok: true, via: "base64", mediaType: "image/png", data: "iVBORw0K"},
		{in: `"DATA:image\/jpeg;base64,/9j/"`, ok: true, via: "base64", mediaType: "image/jpeg", data: "/9j/"},
		{in: `"imgctx:sha256-00"`, ok: true, via: "ref", url: "imgctx:sha256-00"},
		{in: `"https://example.com/a.png?x=1\u0026y=2"`, ok: true, via: "url", url: "https://example.com/a.png?x=1&y=2"},
		{in: `{"url":"x"}`},
		{in: "\"data:image/png\x01;base64,iVBO\"", err: "invalid data URL"},
	} {
		b := []byte(`{"u":` + c.in + `}`)
		slot, ok, err := URLSlot(b, Span{Start: 5, End: 5 + len(c.in)})
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v; want one saying %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || ok != c.ok || slot.Via != c.via || slot.MediaType != c.mediaType || slot.URL != c.url ||
			(c.data != "" && string(b[slot.Data.Start:slot.Data.End]) != c.data) {
			t.Errorf("%s: %+v ok %v err %v", c.in, slot, ok, err)
		}
	}
}
