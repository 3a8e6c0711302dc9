package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"pgregory.net/rapid"
)

// Bodies large enough to be compared as they arrive (arrivingFrom) go
// upstream exactly as sent — the history re-sent, edited in its middle at
// the same length, then grown — with a screenshot inline among them.
func TestArrivingBodiesForwardAsSent(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	screen := `{"role":"user","content":[{"type":"text","text":"this screen"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}`
	history := func(rounds int, edit string) []byte {
		return chatHistory("you write code"+strings.Repeat(" carefully", 800), rounds, 30, edit, screen)
	}
	bodies := [][]byte{history(100, ""), history(100, ""), history(100, "EDITED"), history(101, "EDITED")}
	if len(bodies[0]) < arrivingFrom {
		t.Fatalf("the body is %d bytes, under %d", len(bodies[0]), arrivingFrom)
	}
	for i, body := range bodies {
		if resp, b := g.do(t, "POST", "/v1/chat/completions", "", body); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		got := g.up.received()
		if last := got[len(got)-1]; !bytes.Equal(last, body) {
			t.Fatalf("request %d: the upstream got %d bytes, not the %d sent", i, len(last), len(body))
		}
	}
}

// chatHistory is an OpenAI chat body: the system message, the opening
// messages, then rounds of a user's step and the assistant's answer, the
// step of round edited starting with edit.
func chatHistory(system string, rounds, edited int, edit string, opening ...string) []byte {
	msgs := append([]string{`{"role":"system","content":"` + system + `"}`}, opening...)
	for k := range rounds {
		text := fmt.Sprintf("step %03d %s", k, strings.Repeat("x", 900))
		if k == edited {
			text = edit + text[len(edit):]
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"%s"}`, text), fmt.Sprintf(`{"role":"assistant","content":"done %03d"}`, k))
	}
	return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`)
}

// readComparing fills the body whatever the reads' sizes, and a body
// shorter than its length is an error, as io.ReadFull's.
func TestReadComparingFillsTheBody(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789"), 10_000)
	for name, r := range map[string]io.Reader{
		"half":     iotest.HalfReader(bytes.NewReader(want)),
		"one byte": iotest.OneByteReader(bytes.NewReader(want)),
		"data+EOF": iotest.DataErrReader(bytes.NewReader(want)),
	} {
		b := make([]byte, len(want))
		copy(b, want[:100])
		if _, err := io.CopyN(io.Discard, r, 100); err != nil {
			t.Fatal(err)
		}
		if err := readComparing(r, b, 100, nil, nil, nil); err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%s: err %v, equal %v", name, err, bytes.Equal(b, want))
		}
	}
	b := make([]byte, len(want)+1)
	if err := readComparing(bytes.NewReader(want), b, 0, nil, nil, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a short body: %v", err)
	}
}

// The next request of a conversation is read into the buffer of the one
// before: the bytes the two share are compared, not written again, and the
// conversation holds one body instead of two while it arrives. Whatever
// the edit — none, a message changed in the middle, rounds more, rounds
// fewer — the upstream gets the bytes the client sent, and the scan takes
// over exactly the previous request's messages that end before the first
// byte that differs.
func TestTheNextBodyIsReadIntoTheOneBefore(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	conversation := 0
	rapid.Check(t, func(t *rapid.T) {
		conversation++
		if raceEnabled && conversation > 10 {
			return // under the race detector a few conversations tell what a hundred would
		}
		system := fmt.Sprintf(`{"role":"system","content":"conversation %d:%s"}`, conversation, strings.Repeat(" be brief", 600))
		text := rapid.StringOfN(rapid.RuneFrom([]rune("abcde ")), 800, 2000, -1)
		// The assistant's answers carry fields imgctx does not model, and
		// so does the request: they reach the upstream as they came too.
		const answer = `{"role":"assistant","content":"ok","reasoning_content":"thought","x_vendor":{"k":[1,{"a":null}]}}`
		var rounds []string
		for range rapid.IntRange(50, 90).Draw(t, "rounds") {
			rounds = append(rounds, fmt.Sprintf(`{"role":"user","content":"%s"},`+answer, text.Draw(t, "text")))
		}
		// body is the request of the rounds so far; ends, where each of
		// its messages ends.
		body := func() ([]byte, []int) {
			b := []byte(`{"model":"gpt-4o","messages":[` + system)
			ends := []int{len(b)}
			for _, r := range rounds {
				user, _, _ := strings.Cut(r, `},{`)
				b = append(b, ',')
				ends = append(ends, len(b)+len(user)+1, len(b)+len(r))
				b = append(b, r...)
			}
			return append(b, `],"stream":false,"x_top":{"keep":[true]}}`...), ends
		}
		var prev []byte
		var prevEnds []int
		held := 0 // the capacity of the buffer the conversation's last body is in (0: none pooled)
		for i := range rapid.IntRange(2, 6).Draw(t, "requests") {
			if i > 0 {
				switch rapid.IntRange(0, 3).Draw(t, "edit") {
				case 1: // a message changed in the middle
					k := rapid.IntRange(0, len(rounds)-1).Draw(t, "changed")
					rounds[k] = fmt.Sprintf(`{"role":"user","content":"%s"},`+answer, text.Draw(t, "text"))
				case 2:
					for range rapid.IntRange(1, 3).Draw(t, "more") {
						rounds = append(rounds, fmt.Sprintf(`{"role":"user","content":"%s"},`+answer, text.Draw(t, "text")))
					}
				case 3:
					rounds = rounds[:len(rounds)-rapid.IntRange(1, 10).Draw(t, "fewer")]
				}
			}
			b, ends := body()
			want := 0 // the previous request's messages that end before the first byte that differs
			if prev != nil {
				n := wire.CommonPrefix(prev, b)
				for want < len(prevEnds) && prevEnds[want] <= n {
					want++
				}
			}
			// Read into the one before where both are compared as they
			// arrive and its buffer holds this body, at most an eighth more.
			inPlace := len(prev) >= arrivingFrom && len(b) >= arrivingFrom && held >= len(b) && held <= len(b)+len(b)/8
			switch {
			case inPlace:
			case len(b) >= arrivingFrom:
				held = poolSizes[class(len(b))]
			default:
				held = 0
			}
			resumed := testutil.ToFloat64(g.server.metrics.scanned.WithLabelValues("resumed"))
			inPlaces := testutil.ToFloat64(g.server.metrics.bodiesInPlace)
			resp, err := http.Post(g.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, answer)
			}
			got := g.up.received()
			if last := got[len(got)-1]; !bytes.Equal(last, b) {
				t.Fatalf("request %d: the upstream got %d bytes, not the %d sent (first difference at %d)", i, len(last), len(b), wire.CommonPrefix(last, b))
			}
			if n := int(testutil.ToFloat64(g.server.metrics.scanned.WithLabelValues("resumed")) - resumed); n != want {
				t.Fatalf("request %d: %d messages resumed, want %d", i, n, want)
			}
			if got := testutil.ToFloat64(g.server.metrics.bodiesInPlace) - inPlaces; got != map[bool]float64{true: 1}[inPlace] {
				t.Fatalf("request %d of %d bytes after %d (a buffer of %d): read in place %v times, want %v", i, len(b), len(prev), held, got, inPlace)
			}
			g.done.wait()
			prev, prevEnds = b, ends
		}
	})
}

// Two requests of one conversation at once, each different from the one
// before: both go upstream as sent. Were both read into the buffer of the
// request before, or one into memory the other compares with, a byte of
// one would be the other's (and the race detector would say so).
func TestTwoNextBodiesAtOnce(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	history := func(rounds int, edit string) []byte {
		return chatHistory("two at once"+strings.Repeat(" quickly", 800), rounds, 10, edit)
	}
	post := func(b []byte) error {
		resp, err := http.Post(g.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if answer, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
			return fmt.Errorf("%d %s", resp.StatusCode, answer)
		}
		return nil
	}
	for round := range 20 {
		if err := post(history(80, "first")); err != nil {
			t.Fatal(err)
		}
		g.done.wait()
		bodies := [][]byte{history(80, fmt.Sprintf("left %02d", round)), history(81, "first")}
		errs := make(chan error, 2)
		for _, b := range bodies {
			go func() { errs <- post(b) }()
		}
		for range bodies {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		got := g.up.received()
		for _, b := range bodies {
			if !slices.ContainsFunc(got[len(got)-2:], func(r []byte) bool { return bytes.Equal(r, b) }) {
				t.Fatalf("round %d: a body of %d bytes did not reach the upstream as sent", round, len(b))
			}
		}
		g.done.wait()
	}
}

// A request whose previous one another scan still reads does not take its
// buffer: the other scan finds every byte where it was.
func TestABufferAnotherScanReadsIsNotTaken(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	system := "held" + strings.Repeat(" still", 800)
	first, edited := chatHistory(system, 80, 10, "first"), chatHistory(system, 80, 10, "other")
	for _, b := range [][]byte{first, edited} {
		if resp, answer := g.do(t, "POST", "/v1/chat/completions", "", b); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, answer)
		}
		g.done.wait()
	}
	// Another scan of the conversation, begun: it reads the edited body's
	// buffer, as a request arriving slowly would.
	reading := g.engine.Arriving("default", openai.Dialect, http.Header{}, edited[:engine.ArrivingHead])
	if reading == nil {
		t.Fatal("the conversation has no previous request")
	}
	defer reading.Release()
	before := testutil.ToFloat64(g.server.metrics.bodiesInPlace)
	if resp, answer := g.do(t, "POST", "/v1/chat/completions", "", first); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, answer)
	}
	if n := testutil.ToFloat64(g.server.metrics.bodiesInPlace) - before; n != 0 {
		t.Fatalf("read in place %v times while another scan read the buffer", n)
	}
	reading.Compare(engine.ArrivingHead, edited[engine.ArrivingHead:])
	if shared := len(edited) - len(`]}`); reading.Known() != shared { // to its last message's end
		t.Fatalf("the other scan found %d of the %d bytes it shares with the buffer", reading.Known(), shared)
	}
}
