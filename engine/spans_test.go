package engine

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
)

func spanEngine(t *testing.T) (*Engine, *imagestore.Mem) {
	images := &imagestore.Mem{}
	return &Engine{Images: imagestore.Verified{Store: images}, Sessions: &session.Mem{}}, images
}

// liftSpan takes an inline image as a request's scan does: its ref, and
// whether it was stored (not a span seen before).
func liftSpan(t *testing.T, e *Engine, tenant, b64 string) (blob.Ref, bool) {
	t.Helper()
	l, err := e.liftBase64(t.Context(), tenant, []byte(b64), "image/png", nil)
	var stored bool
	if err == nil {
		stored, err = e.commit(t.Context(), tenant, l)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l.in.Ref, stored
}

// ageSpans makes every remembered span due for its touch in the store.
func ageSpans(e *Engine) {
	e.spans.mu.Lock()
	defer e.spans.mu.Unlock()
	for k, v := range e.spans.spans {
		v.touched = time.Now().Add(-TouchEvery)
		e.spans.spans[k] = v
	}
}

// A span seen before is not decoded or stored again; if its blob has gone
// (gc), or another tenant sends the same text, it is stored anew.
func TestRepeatedSpansAreRememberedPerTenant(t *testing.T) {
	e, images := spanEngine(t)
	_, b64, _ := strings.Cut(screenshot(64, 48, 1), ",")
	stores := 0
	lift := func(tenant string) blob.Ref {
		ref, stored := liftSpan(t, e, tenant, b64)
		if stored {
			stores++
		}
		return ref
	}
	first := lift("default")
	if _, ok := e.seenSpan(t.Context(), e.spans.keyOf("default", []byte(b64))); !ok {
		t.Fatal("the span was not remembered")
	}
	if lift("default") != first || stores != 1 {
		t.Fatalf("a repeat gave another ref or was stored again (%d stores)", stores)
	}
	// Deleted behind its back: once the span is due for its touch (every
	// minute), the next request finds the blob gone and stores it again.
	images.Delete(t.Context(), "default", first)
	ageSpans(e)
	if lift("default") != first || stores != 2 {
		t.Fatalf("a span whose blob was deleted was not stored again (%d stores)", stores)
	}
	// Another tenant: its own copy, never the first tenant's.
	lift("other")
	if stores != 3 {
		t.Fatal("another tenant reused a span remembered for someone else")
	}
	if _, err := images.Get(t.Context(), "other", first); err != nil {
		t.Fatalf("the other tenant's copy is not in its store: %v", err)
	}
}

// An image re-sent inline keeps its blob young: once a minute
// (TouchEvery) a repeat touches it in the store, so the image-store GC,
// which takes what was not touched within its cutoff, never collects an
// image a conversation still sends; in between, repeats touch nothing.
func TestARepeatedSpanKeepsItsBlobYoung(t *testing.T) {
	e, images := spanEngine(t)
	now := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	images.Now = func() time.Time { return now }
	_, b64, _ := strings.Cut(screenshot(64, 48, 1), ",")
	lift := func() blob.Ref { ref, _ := liftSpan(t, e, "default", b64); return ref }
	ref := lift()
	dated := func() time.Time {
		in, err := images.Stat(t.Context(), "default", ref)
		if err != nil {
			t.Fatal(err)
		}
		return in.ModTime
	}
	stored := dated()
	now = now.Add(2 * time.Hour)
	lift() // within the minute: nothing touched
	if !dated().Equal(stored) {
		t.Fatal("a repeat within the minute touched the store")
	}
	ageSpans(e)
	if lift() != ref || !dated().Equal(now) {
		t.Fatalf("a repeat past the minute left the blob dated %v, want %v", dated(), now)
	}
	if st, err := imagestore.GC(t.Context(), images, "default", now.Add(-time.Hour), nil, nil); err != nil || st.Removed != 0 {
		t.Fatalf("GC with a cutoff an hour back removed %d (%v): the image was still being sent", st.Removed, err)
	}
}

// The encoding cache holds what was expanded, not every image a client
// sent inline: a drop-in client's own bytes go upstream as they came, and
// holding a copy of each (as the cache once did) kept hundreds of
// megabytes no request read. The first expansion encodes the stored
// bytes; the next is answered from the cache.
func TestTheEncodingCacheHoldsOnlyWhatWasExpanded(t *testing.T) {
	e, images := spanEngine(t)
	_, b64, _ := strings.Cut(screenshot(64, 48, 2), ",")
	l, err := e.liftBase64(t.Context(), "default", []byte(b64), "image/png", nil)
	if err == nil {
		_, err = e.commit(t.Context(), "default", l)
	}
	if err != nil || !l.canonical {
		t.Fatalf("canonical %v, err %v", l.canonical, err)
	}
	if _, held := e.b64.get(l.in.Ref); held || e.b64.size != 0 {
		t.Fatalf("a lifted span filled the encoding cache (%d bytes)", e.b64.size)
	}
	got, err := e.Base64(t.Context(), "default", l.in.Ref)
	if err != nil || got != b64 {
		t.Fatalf("the stored bytes expand to another text: %v", err)
	}
	images.Delete(t.Context(), "default", l.in.Ref) // only the cache can answer now
	if got, err := e.Base64(t.Context(), "default", l.in.Ref); err != nil || got != b64 {
		t.Fatalf("the second expansion was not answered from the cache: %v", err)
	}
}

// The scan a conversation's next request resumes from is the request as
// it was read: ingestion fills in the images of a copy (only the messages
// holding them are copied), never of the scan itself.
func TestProxyLeavesTheResumedScanAsRead(t *testing.T) {
	client := okUpstream(t, nil)
	e := proxyEngine(client)
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"open the page"},{"role":"assistant","content":"done"},` +
		`{"role":"user","content":[{"type":"text","text":"this one"},{"type":"image_url","image_url":{"url":"` + screenshot(64, 48, 1) + `"}}]}]}`)
	p, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
		Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close(t.Context())
	kept, done := e.spans.resumeFor(e.spans.resumeKeyOf("a", openai.Dialect.Name, http.Header{}, body))
	defer done()
	fresh, err := openai.Dialect.Scan(body, wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kept.res == nil || len(kept.res.Messages) != len(fresh.Messages) {
		t.Fatalf("the conversation's scan was not kept: %+v", kept.res)
	}
	for i := range fresh.Messages {
		if !chat.Equal(kept.res.Messages[i], fresh.Messages[i]) {
			t.Fatalf("message %d of the kept scan changed: %+v, read %+v", i, kept.res.Messages[i], fresh.Messages[i])
		}
	}
}

// A resume holds its request's memory (the gateway's pooled buffer) until
// it is replaced or forgotten and no scan reads it: a scan that took it
// keeps it from going back to the pool while it compares.
func TestAResumeHoldsItsBodyWhileAScanReadsIt(t *testing.T) {
	c := newSpanCache()
	k := resumeKey{tenant: "a", h: 1}
	released := 0
	c.keepResume(k, resumed{res: &wire.Resume{Body: []byte("first")}, held: &heldBody{release: func() { released++ }}})
	_, done := c.resumeFor(k) // a scan compares with it
	c.keepResume(k, resumed{res: &wire.Resume{Body: []byte("second")}, held: &heldBody{release: func() { released += 10 }}})
	if released != 0 {
		t.Fatalf("a body a scan reads was let go (%d)", released)
	}
	done()
	if released != 1 {
		t.Fatalf("the replaced body, read no more, was not let go (%d)", released)
	}
	if c.held != len("second") {
		t.Fatalf("held %d bytes, want %d", c.held, len("second"))
	}
	// A body too large is never held.
	c.keepResume(resumeKey{tenant: "b"}, resumed{res: &wire.Resume{Body: make([]byte, maxResumeBytes/2+1)}, held: &heldBody{release: func() { released += 100 }}})
	if released != 101 || c.held != len("second") {
		t.Fatalf("a body over half the bound: released %d, held %d", released, c.held)
	}
}

// Past either bound the conversations least recently sent are forgotten,
// one at a time, and the others keep their resumes (a full cache used to
// forget them all, and every conversation was then read whole again).
func TestResumesPastTheBoundForgetTheOldest(t *testing.T) {
	c := newSpanCache()
	let := map[uint64]bool{}
	keep := func(h uint64, n int) {
		c.keepResume(resumeKey{tenant: "a", h: h}, resumed{res: &wire.Resume{Body: make([]byte, n)}, held: &heldBody{release: func() { let[h] = true }}})
	}
	for h := range uint64(maxResumes) {
		keep(h, 10)
	}
	keep(0, 10) // conversation 0 sends again: now 1 is the oldest
	keep(maxResumes, 10)
	if len(c.resumes) != maxResumes || !let[1] || len(let) != 2 || !let[0] {
		t.Fatalf("after one past the count: %d held, let go %v; want %d held, 1 (and 0's replaced body) let go", len(c.resumes), let, maxResumes)
	}
	if _, ok := c.resumes[resumeKey{tenant: "a", h: 0}]; !ok {
		t.Fatal("the conversation sent again was forgotten")
	}
	// Two bodies of 40% of the bytes bound: the second pushes out enough
	// of the oldest, and only them, to fit.
	c = newSpanCache()
	clear(let)
	keep(999, 10)
	keep(1000, maxResumeBytes*2/5)
	keep(1001, maxResumeBytes*2/5)
	if _, ok := c.resumes[resumeKey{tenant: "a", h: 1000}]; !ok || c.held > maxResumeBytes || len(let) != 0 {
		t.Fatalf("two bodies within the bound: held %d bytes, let go %v", c.held, let)
	}
	keep(1002, maxResumeBytes*2/5)
	if _, ok := c.resumes[resumeKey{tenant: "a", h: 1000}]; ok || c.held > maxResumeBytes || !let[1000] || !let[999] {
		t.Fatalf("a third body: held %d bytes (bound %d), let go %v; want 999 and 1000 forgotten", c.held, maxResumeBytes, let)
	}
	if _, ok := c.resumes[resumeKey{tenant: "a", h: 1001}]; !ok {
		t.Fatal("the newer large body was forgotten too")
	}
}

// Requests of one conversation at once, each the history grown by some
// rounds, with images and readers counted as the gateway counts them: a
// scan that extends the previous request in place and the ones that copy
// never see each other's messages (each gets exactly a full scan's view),
// and every held body is let go once nothing holds it (run with -race).
func TestConcurrentResumesOfOneConversation(t *testing.T) {
	client := okUpstream(t, nil)
	e := proxyEngine(client)
	// Rounds past the second carry images of their own request: a view
	// holding another request's messages shows another image.
	seed := func(req, k int) uint8 {
		if k < 2 {
			return uint8(k)
		}
		return uint8(2 + req*7 + k)
	}
	history := func(req, rounds int) []byte {
		var msgs []string
		// A system prompt over the 4 KB the conversation is recognised by.
		msgs = append(msgs, `{"role":"system","content":"you drive a browser`+strings.Repeat(" carefully", 500)+`"}`)
		for k := range rounds {
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"step %d"},{"type":"image_url","image_url":{"url":"%s"}}]}`, k, screenshot(32, 24, seed(req, k))),
				fmt.Sprintf(`{"role":"assistant","content":"done %d"}`, k))
		}
		return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`)
	}
	ref := func(req, k int) blob.Ref {
		_, b64, _ := strings.Cut(screenshot(32, 24, seed(req, k)), ",")
		raw, _ := base64.StdEncoding.DecodeString(b64)
		return blob.Of(raw)
	}
	var readers sync.WaitGroup
	send := func(i, rounds int) {
		body := history(i, rounds)
		p, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
			Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Keep: true, Readers: &readers})
		if err != nil {
			t.Error(err)
			return
		}
		defer p.Close(t.Context())
		imgs := p.Images()
		if len(imgs) != rounds {
			t.Errorf("request %d: %d images sent or not, the body has %d", i, len(imgs), rounds)
			return
		}
		for k, img := range imgs {
			if img.Ref != ref(i, k) || img.Msg != 1+2*k {
				t.Errorf("request %d: image %d is %s at message %d, want %s at %d: another request's view", i, k, img.Ref, img.Msg, ref(i, k), 1+2*k)
			}
		}
	}
	send(0, 2) // the resume every other request extends (its two rounds are everyone's)
	if r, done := e.spans.resumeFor(e.spans.resumeKeyOf("a", openai.Dialect.Name, http.Header{}, history(0, 2))); r.res == nil {
		t.Fatal("the first request left nothing to resume from")
	} else {
		done()
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			<-start
			send(i+1, 3+i%6)
		})
	}
	close(start)
	wg.Wait()
	// The last resume still holds its request; forgetting it lets go of it.
	e.spans.mu.Lock()
	for _, r := range e.spans.resumes {
		e.spans.drop(r)
	}
	clear(e.spans.resumes)
	e.spans.mu.Unlock()
	readers.Wait()
}

// A conversation quiet for idleFor lets its held request go — a gateway
// whose traffic stops does not hold its bound for good — and one that
// sent again since keeps its own.
func TestAQuietConversationLetsItsRequestGo(t *testing.T) {
	c := newSpanCache()
	c.idleFor = 50 * time.Millisecond
	var mu sync.Mutex
	let := map[uint64]bool{}
	keep := func(h uint64) {
		c.keepResume(resumeKey{tenant: "a", h: h}, resumed{res: &wire.Resume{Body: make([]byte, 10)}, held: &heldBody{release: func() {
			mu.Lock()
			defer mu.Unlock()
			let[h] = true
		}}})
	}
	keep(1)
	keep(2)
	time.Sleep(30 * time.Millisecond)
	keep(2) // conversation 2 sends again: its earlier request goes, the new one is kept
	forgotten := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.resumes[resumeKey{tenant: "a", h: 1}]
		return !ok
	}
	deadline := time.Now().Add(5 * time.Second)
	for !forgotten() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	c.mu.Lock()
	_, kept2 := c.resumes[resumeKey{tenant: "a", h: 2}]
	held, trimming := c.held, c.trimming
	c.mu.Unlock()
	mu.Lock()
	if !let[1] || !let[2] {
		t.Fatalf("let go %v; want 1 (quiet) and 2's replaced request", let)
	}
	mu.Unlock()
	if !forgotten() || !kept2 || held != 10 || !trimming {
		t.Fatalf("1 forgotten %v, 2 kept %v, held %d, a trim timed %v; want true, true, 10, true", forgotten(), kept2, held, trimming)
	}
	// Then 2, quiet too; with nothing left, no trim is timed.
	deadline = time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		n, trimming := len(c.resumes), c.trimming
		c.mu.Unlock()
		if n == 0 && !trimming {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d resumes held, a trim timed %v, long after idleFor", n, trimming)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A conversation's request that extends the previous one takes over that
// request's filled view and appends to it, past what the previous
// request's readers read: the history is not copied, each request's view
// is exactly what filling in a fresh scan gives (tool images relayed in a
// user message included), and the previous request's view is left as it
// was. A request that changes an earlier message copies.
func TestAGrowingConversationExtendsItsFilledView(t *testing.T) {
	client := okUpstream(t, nil)
	e := proxyEngine(client)
	// Each round: the user's screenshot, a tool call, its answer, and the
	// tool's screenshot relayed in the user message after it.
	history := func(rounds int, first string) []byte {
		msgs := []string{`{"role":"system","content":"you drive a browser` + strings.Repeat(" carefully", 500) + `"}`}
		for k := range rounds {
			text := fmt.Sprintf("step %d", k)
			if k == 0 {
				text = first
			}
			msgs = append(msgs,
				fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q},{"type":"image_url","image_url":{"url":"%s"}}]}`, text, screenshot(32, 24, uint8(2*k))),
				fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"c%d","type":"function","function":{"name":"look","arguments":"{}"}}]}`, k),
				fmt.Sprintf(`{"role":"tool","tool_call_id":"c%d","content":"here"}`, k),
				fmt.Sprintf(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"%s"}}]}`, screenshot(32, 24, uint8(2*k+1))),
				fmt.Sprintf(`{"role":"assistant","content":"done %d"}`, k))
		}
		return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`)
	}
	send := func(body []byte) []chat.Message {
		t.Helper()
		p, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
			Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		p.Close(t.Context())
		got := p.fw.r.Messages
		sp, err := openai.Dialect.Scan(body, wire.ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		in, err := e.ingestSlots(t.Context(), "a", sp, nil, nil, &ProxyCounts{})
		if err != nil {
			t.Fatal(err)
		}
		want := in.msgs
		if len(got) != len(want) {
			t.Fatalf("%d messages filled in, a fresh scan has %d", len(got), len(want))
		}
		for i := range want {
			if !chat.Equal(got[i], want[i]) {
				t.Fatalf("message %d: %+v, filled in from a fresh scan %+v", i, got[i], want[i])
			}
		}
		if img := got[4].Parts[0].(chat.Image); img.Origin != chat.FromTool {
			t.Fatalf("the relayed tool screenshot's origin is %q", img.Origin)
		}
		return got
	}
	deepCopy := func(msgs []chat.Message) []chat.Message {
		out := make([]chat.Message, len(msgs))
		for i, m := range msgs {
			out[i] = m.Clone()
		}
		return out
	}
	shares := func(a, b []chat.Message) bool { return &a[0] == &b[0] }
	// room is how many messages the conversation's filled view has room
	// for: past it, appending copies, once in a while as append does.
	room := func() int {
		kept, done := e.spans.resumeFor(e.spans.resumeKeyOf("a", openai.Dialect.Name, http.Header{}, history(1, "open the page")))
		defer done()
		return cap(kept.filled)
	}
	prev := send(history(2, "open the page"))
	extended := 0
	for rounds := 3; rounds <= 12; rounds++ {
		was, fits := deepCopy(prev), room() >= 1+5*rounds
		cur := send(history(rounds, "open the page"))
		if fits {
			if !shares(cur, prev) {
				t.Fatalf("round %d: the request extending the previous one copied its history", rounds)
			}
			extended++
		}
		for i := range was {
			if !chat.Equal(prev[i], was[i]) {
				t.Fatalf("round %d: the previous request's message %d changed", rounds, i)
			}
		}
		prev = cur
	}
	if extended < 6 {
		t.Fatalf("%d of 10 requests extended the previous filled view in place", extended)
	}
	// Re-sent unchanged, it takes the same view over as it is.
	if again := send(history(12, "open the page")); !shares(again, prev) || len(again) != len(prev) {
		t.Fatal("the same history re-sent did not take its filled view over")
	}
	// The first message changed: nothing to take over, a copy.
	if edited := send(history(13, "open the other page")); shares(edited, prev) {
		t.Fatal("a request that changed the first message extended the previous view")
	}
}

// okUpstream is an OpenAI upstream that answers every request "ok",
// handing each body it reads to seen when that is not nil.
func okUpstream(t *testing.T, seen func(body []byte)) *upstream.Client {
	return meteredUpstream(t, func(b []byte) int {
		if seen != nil {
			seen(b)
		}
		return 10
	})
}

// meteredUpstream is okUpstream reporting the prompt tokens prompt says
// the body it read holds.
func meteredUpstream(t *testing.T, prompt func(body []byte) int) *upstream.Client {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":1}}`, prompt(b))
	}))
	t.Cleanup(up.Close)
	return &upstream.Client{Format: upstream.OpenAI, BaseURL: up.URL, MaxRetries: -1}
}

// proxyEngine is an engine on memory stores, with the built-in profiles,
// in front of client.
func proxyEngine(client *upstream.Client) *Engine {
	return &Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tokens.Default(), Upstream: client}
}

// A request that takes its conversation's previous messages over with
// their decisions put back (proxyRequest.Prior) sends what deciding them
// afresh sends. Two engines take the same growing conversation — rounds
// of text, rounds bringing a tool's screenshot, turns of the human with
// their own, a window of 6,000 tokens that has one removed —
// one of them made to forget each request's filled and decided views:
// every request goes upstream byte for byte the same, with the same images
// not sent. Requests after text rounds take the history over; one after a
// round that brought an image cannot (its decision came after), nor one
// after a removal.
func TestTakingTheDecidedHistoryOverSendsWhatDecidingAfreshSends(t *testing.T) {
	edge := tokens.Profile{Name: "edge", Match: []string{"edge-*"}, Family: "openai", ContextWindow: 6_000, Vision: true,
		Tokenizer: "chars4", Image: tokens.ImageRule{Rule: "openai_tile", BaseTokens: 85, TileTokens: 170}}
	table, err := tokens.Default().With(edge)
	if err != nil {
		t.Fatal(err)
	}
	type rig struct {
		e      *Engine
		client *upstream.Client
		sent   [][]byte
	}
	newRig := func() *rig {
		r := &rig{}
		// The prompt as the profile prices it: its images, and its text
		// (the images' base64 is not text).
		r.client = meteredUpstream(t, func(b []byte) int {
			r.sent = append(r.sent, b)
			return 255*bytes.Count(b, []byte(`"type":"image_url"`)) + len(dataURL.ReplaceAll(b, nil))/4
		})
		r.e = proxyEngine(r.client)
		r.e.Profiles = table
		return r
	}
	taking, afresh := newRig(), newRig()
	history := func(rounds int) []byte {
		msgs := []string{`{"role":"system","content":"you drive a browser` + strings.Repeat(" carefully", 100) + `"}`}
		for k := range rounds {
			if k%6 == 0 {
				msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"now this, %d"},{"type":"image_url","image_url":{"url":"%s"}}]}`, k, screenshot(32, 24, uint8(100+k))))
			}
			msgs = append(msgs,
				fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"c%d","type":"function","function":{"name":"look","arguments":"{}"}}]}`, k),
				fmt.Sprintf(`{"role":"tool","tool_call_id":"c%d","content":"here"}`, k))
			if k%3 == 1 {
				msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"%s"}}]}`, screenshot(32, 24, uint8(k))))
			}
		}
		return []byte(`{"model":"edge-1","messages":[` + strings.Join(msgs, ",") + `]}`)
	}
	send := func(r *rig, body []byte) *Proxied {
		t.Helper()
		p, err := r.e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
			Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: r.client}}, Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(p.Response.Body)
		p.Read(answer)
		if err := p.Settle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var was []chat.Message
	took, removed := 0, 0
	for rounds := 1; rounds <= 36; rounds++ {
		body := history(rounds)
		p, q := send(taking, body), send(afresh, body)
		afresh.e.spans.mu.Lock()
		for k, r := range afresh.e.spans.resumes {
			r.filled, r.applied = nil, nil
			afresh.e.spans.resumes[k] = r
		}
		afresh.e.spans.mu.Unlock()
		if got, want := taking.sent[len(taking.sent)-1], afresh.sent[len(afresh.sent)-1]; !bytes.Equal(got, want) {
			t.Fatalf("%d rounds: sent\n%s\ndecided afresh\n%s", rounds, got, want)
		}
		if !slices.Equal(p.fw.NotSent, q.fw.NotSent) {
			t.Fatalf("%d rounds: not sent %v, decided afresh %v", rounds, p.fw.NotSent, q.fw.NotSent)
		}
		if a := p.fw.applied; a != nil {
			if was != nil && &a[0] == &was[0] {
				took++
			}
			was = a
		}
		removed = max(removed, len(p.fw.NotSent))
	}
	if took < 10 || removed < 1 {
		t.Fatalf("%d of 35 requests took the decided history over, at most %d images were left out: the test no longer shows it", took, removed)
	}
}

// dataURL matches an image's data URL in a request body.
var dataURL = regexp.MustCompile(`data:image/[a-z]+;base64,[A-Za-z0-9+/=]+`)
