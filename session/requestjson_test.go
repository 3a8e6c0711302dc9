package session_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"pgregory.net/rapid"
)

// EncodeRequest writes by hand what json.Marshal writes: the same bytes
// for any line, escapes, empty members and awkward numbers included, and
// an error where json.Marshal has one (a NaN or an infinity).
func TestEncodeRequestIsJSONMarshal(t *testing.T) {
	str := rapid.OneOf(
		rapid.Just(""),
		rapid.StringMatching(`[a-z0-9_.:-]{1,20}`),
		rapid.String(),
		rapid.SampledFrom([]string{`say "hi"`, `a\b`, "<b>&</b>", "tab\there", "nl\n", "\x00\x1f\x7f", "\u2028\u2029", "é漢🙂", "\xff\xfe bad utf-8", "\ufffd"}),
		rapid.Map(rapid.SliceOf(rapid.Byte()), func(b []byte) string { return string(b) }),
	)
	num := rapid.OneOf(
		rapid.Float64(),
		rapid.SampledFrom([]float64{0, math.Copysign(0, -1), 1e-7, -1e-7, 1e-6, 9.99e-7, 1e20, 1e21, -1e21, 1.5e300, 5e-324, 0.1, 123.456, 2.5e-5}),
	)
	odd := rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1)})
	small := rapid.IntRange(-3, 1<<20)
	rapid.Check(t, func(t *rapid.T) {
		f := func(label string) float64 {
			if rapid.IntRange(0, 40).Draw(t, label+"-odd") == 0 {
				return odd.Draw(t, label)
			}
			return num.Draw(t, label)
		}
		r := session.Request{
			ID: str.Draw(t, "id"), UpstreamID: str.Draw(t, "upstream_id"),
			Time:   time.Unix(0, rapid.Int64Range(-1<<62, 1<<62).Draw(t, "time")).In(time.FixedZone("x", 3600)),
			Tenant: str.Draw(t, "tenant"), Conversation: str.Draw(t, "conversation"), Route: str.Draw(t, "route"),
			Wire: str.Draw(t, "wire"), Model: str.Draw(t, "model"), Profile: str.Draw(t, "profile"), Upstream: str.Draw(t, "upstream"),
			Status: small.Draw(t, "status"), DurationMS: f("duration"), GatewayMS: f("gateway"), FirstByteMS: f("first"),
			Input: small.Draw(t, "input"), CacheRead: small.Draw(t, "read"), CacheWrite: small.Draw(t, "write"), Output: small.Draw(t, "output"),
			Dollars: f("dollars"), Priced: rapid.Bool().Draw(t, "priced"),
			BytesIn: rapid.Int64().Draw(t, "in"), BytesOut: rapid.Int64().Draw(t, "out"), Window: small.Draw(t, "window"),
			OutlineFrom: small.Draw(t, "from"), Removed: small.Draw(t, "removed"), Break: rapid.Bool().Draw(t, "break"),
			BreakCause: str.Draw(t, "cause"), Replays: small.Draw(t, "replays"), Error: str.Draw(t, "error"),
		}
		for i := range rapid.IntRange(0, 3).Draw(t, "images") {
			var ref blob.Ref
			if rapid.Bool().Draw(t, "valid") {
				ref = blob.Of([]byte{byte(i)})
			}
			r.Images = append(r.Images, session.ImageFate{Ref: ref, Msg: small.Draw(t, "msg"), Sent: rapid.Bool().Draw(t, "sent"),
				Keep: str.Draw(t, "keep"), Reason: reason.Code(str.Draw(t, "reason")), Caption: str.Draw(t, "caption"),
				Width: small.Draw(t, "w"), Height: small.Draw(t, "h"), Tokens: small.Draw(t, "tokens")})
		}
		if rapid.IntRange(0, 5).Draw(t, "empty-images") == 0 {
			r.Images = []session.ImageFate{} // empty, not nil: omitted all the same
		}
		for range rapid.IntRange(0, 3).Draw(t, "outline") {
			r.Outline = append(r.Outline, session.Folded{Role: str.Draw(t, "role"), Bytes: small.Draw(t, "bytes")})
		}
		got, err := session.EncodeRequest(r)
		utc := r
		utc.Time = time.Unix(0, r.Time.UnixNano()).UTC()
		want, wantErr := json.Marshal(utc)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("error %v, json.Marshal's %v", err, wantErr)
		}
		if string(got) != string(want) {
			t.Fatalf("encoded\n%s\njson.Marshal\n%s", got, want)
		}
		if err == nil {
			back, err := session.DecodeRequest(got)
			if err != nil || !back.Time.Equal(r.Time) || back.Status != r.Status || len(back.Images) != len(r.Images) {
				t.Fatalf("decoding it back: %v", err)
			}
		}
	})
}

func BenchmarkEncodeRequest(b *testing.B) {
	r := session.Request{ID: "req_0193a1b2c3d4e5f60718293a4b5c6d7e", Time: time.Now(), Tenant: "default", Conversation: "c_9f8e7d6c5b4a3928",
		Route: "openai.chat", Wire: "openai", Model: "gpt-4o", Profile: "gpt-4o", Upstream: "default", Status: 200, DurationMS: 1.234,
		GatewayMS: 0.211, FirstByteMS: 1.1, Input: 1200, CacheRead: 1024, Output: 12, Dollars: 0.0021, Priced: true, BytesIn: 1010, BytesOut: 230,
		Window: 128000, Outline: []session.Folded{{Role: "user", Bytes: 980}}}
	for _, name := range []string{"EncodeRequest", "json.Marshal"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if name == "json.Marshal" {
					json.Marshal(r)
				} else {
					session.EncodeRequest(r)
				}
			}
		})
	}
}
