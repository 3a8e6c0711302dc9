package gateway

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

func TestLiftInline(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	ref := "imgctx:sha256-534742a9a0be702e61ca5937b744994707ab2944ffb315b35a959ef1f5173e57"
	cases := []struct {
		name, format, body, want string
	}{
		{"openai image url", "openai", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + ref + `"}}]}]}`},
		{"data URL pasted in text stays", "openai", `{"messages":[{"role":"user","content":"see data:image/png;base64,` + b64 + `"}]}`, ""},
		{"escaped span left for the full parse", "openai", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image\/png;base64,` + b64[:2000] + `\/"}}]}]}`, ""},
		{"anthropic source, type first", "anthropic", `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + ref + `"}}]}]}`},
		{"anthropic source, data first", "anthropic", `{"messages":[{"role":"user","content":[{"type":"image","source":{"data":"` + b64 + `","media_type":"image/png","type":"base64"}}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image","source":{"data":"` + ref + `","media_type":"image/png","type":"base64"}}]}]}`},
		{"anthropic text block named data", "anthropic", `{"messages":[{"role":"user","content":[{"type":"text","text":"x","data":"` + b64 + `"}]}]}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := g.server.liftInline(t.Context(), "default", []byte(c.body), upstream.Format(c.format))
			if err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = c.body
			}
			if string(out) != want {
				t.Fatalf("got  %.300s\nwant %.300s", out, want)
			}
		})
	}
	// A bad span is refused with a reason, as the slow path would.
	_, err := g.server.liftInline(t.Context(), "default", []byte(`{"url":"data:image/png;base64,`+strings.Repeat("%", 2000)+`"}`), upstream.OpenAI)
	if err == nil {
		t.Fatal("a bad base64 span was accepted")
	}
}

// Untrusted bodies: lifting never panics, and whatever it returns parses
// to the same request as the original, images named by ref instead.
func FuzzLiftInline(f *testing.F) {
	_, b64 := samplePNG(&testing.T{})
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+b64+`"}}]}]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+b64+`"}}]}]}`), true)
	f.Add([]byte(`{"url":"data:x;base64,"}`), false)
	g := newGW(&testing.T{}, upstream.OpenAI, nil)
	f.Fuzz(func(t *testing.T, body []byte, anth bool) {
		format := upstream.OpenAI
		if anth {
			format = upstream.Anthropic
		}
		out, err := g.server.liftInline(t.Context(), "default", body, format)
		if err != nil || bytes.Equal(out, body) {
			return
		}
		var before, after int
		if anth {
			r1, e1 := anthropic.DecodeRequest(body)
			r2, e2 := anthropic.DecodeRequest(out)
			if (e1 == nil) != (e2 == nil) {
				t.Fatalf("lifting changed validity: %v / %v", e1, e2)
			}
			if e1 == nil {
				before, after = len(r1.Messages), len(r2.Messages)
			}
		} else {
			r1, e1 := openai.DecodeRequest(body)
			r2, e2 := openai.DecodeRequest(out)
			if (e1 == nil) != (e2 == nil) {
				t.Fatalf("lifting changed validity: %v / %v", e1, e2)
			}
			if e1 == nil {
				before, after = len(r1.Messages), len(r2.Messages)
			}
		}
		if before != after {
			t.Fatalf("lifting changed the messages: %d → %d", before, after)
		}
	})
}

// A span seen before is not decoded or stored again; if its blob has gone
// (gc), or another tenant sends the same text, it is stored anew.
func TestRepeatedSpansAreRememberedPerTenant(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	body := []byte(`{"url":"data:image/png;base64,` + b64 + `"}`)
	lift := func(tenant string) string {
		out, err := g.server.liftInline(t.Context(), tenant, body, upstream.OpenAI)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	first := lift("default")
	if _, ok := g.server.seenSpan(t.Context(), "default", []byte(b64)); !ok {
		t.Fatal("the span was not remembered")
	}
	if lift("default") != first {
		t.Fatal("a repeat gave another ref")
	}
	// Deleted behind its back: the next request stores it again.
	ref := strings.TrimSuffix(strings.TrimPrefix(first, `{"url":"imgctx:`), `"}`)
	g.images.Delete(t.Context(), "default", mustRef(t, ref))
	if lift("default") != first || g.stored(t, "default") != 1 {
		t.Fatal("a span whose blob was deleted was not stored again")
	}
	// Another tenant: its own copy, never the first tenant's.
	lift("other")
	if g.stored(t, "other") != 1 {
		t.Fatal("another tenant reused a span remembered for someone else")
	}
}

func mustRef(t *testing.T, s string) blob.Ref {
	r, err := blob.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The base64 a client sent is what the upstream gets: it primes the
// encoding cache instead of being encoded again from the stored bytes.
func TestLiftedSpanPrimesTheEncoding(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	out, err := g.server.liftInline(t.Context(), "default", []byte(`{"url":"data:image/png;base64,`+b64+`"}`), upstream.OpenAI)
	if err != nil {
		t.Fatal(err)
	}
	ref := mustRef(t, strings.TrimSuffix(strings.TrimPrefix(string(out), `{"url":"imgctx:`), `"}`))
	g.images.Delete(t.Context(), "default", ref) // only the primed encoding can answer now
	got, err := g.engine.Base64(t.Context(), "default", ref)
	if err != nil || got != b64 {
		t.Fatalf("the lifted span did not prime the encoding: %v", err)
	}
}

// Base64 the upstream would not take as it came (URL-safe, unpadded) does
// not prime the cache: the upstream gets the standard encoding.
func TestOnlyStandardSpansPrimeTheEncoding(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	data, _ := samplePNG(t)
	sent := base64.RawURLEncoding.EncodeToString(data)
	out, err := g.server.liftInline(t.Context(), "default", []byte(`{"url":"data:image/png;base64,`+sent+`"}`), upstream.OpenAI)
	if err != nil {
		t.Fatal(err)
	}
	ref := mustRef(t, strings.TrimSuffix(strings.TrimPrefix(string(out), `{"url":"imgctx:`), `"}`))
	got, err := g.engine.Base64(t.Context(), "default", ref)
	if err != nil {
		t.Fatal(err)
	}
	if got != base64.StdEncoding.EncodeToString(data) {
		t.Fatalf("the upstream would get %.40q…, not the standard encoding", got)
	}
}
