package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
)

// Seed keep-turn-images through the drop-in route: each case of the seed
// that the engine tests cover for the sessions API, again from a client that
// re-sends its history.
//
//	gardée au coût mesuré                     TestProxyKeepsAtTheMeasuredCost
//	requête identique avec et sans la clé     TestProxySwitchChangesNothingInsideTheTurn
//	clé retirée: part au tour suivant         TestProxySwitchChangesNothingInsideTheTurn
//	budget, marque au tour suivant            TestProxyEphemeralBecomesAMarkerNextTurn
//	filet réactif                             TestProxyOverflowReplaysOnlyADifferentBody
//	complétion coupée (sans mesure)           TestProxyCutCompletionIsNotMeasured
//	tour = message humain (rappels, outils)   TestProxyReminderBesideAToolResultStaysInTheTurn

// decisions reads what the gateway stored for the agent's conversation.
func (g *agent) decisions() session.Proxied { return g.decisionsOf("default") }

// decisionsOf is decisions for a tenant's agent.
func (g *agent) decisionsOf(tenant string) session.Proxied {
	g.t.Helper()
	sp, err := anthropic.Scan(g.body(), wire.ScanOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	h := http.Header{}
	for k, v := range g.header {
		h.Set(k, v)
	}
	p, err := g.rig.stored().LoadProxied(context.Background(), tenant, engine.ConversationKey(tenant, anthropic.Dialect, h, sp))
	if err != nil {
		g.t.Fatal(err)
	}
	return p
}

func kept(p session.Proxied) (n, cost int) {
	for _, d := range p.Images {
		if d.Keep == chat.Kept {
			n++
			cost += d.Cost
		}
	}
	return n, cost
}

// A 1280×800 screenshot costs 1334 tokens on Claude's rule: the engine
// finds exactly that from the usage delta, text and framing subtracted.
func TestProxyKeepsAtTheMeasuredCost(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	if _, images := g.rig.up.last(); images != 1334 {
		t.Fatalf("the upstream billed %d image tokens; the rig expects 1334", images)
	}
	if n, cost := kept(g.decisions()); n != 1 || cost != 1334 {
		t.Fatalf("%d kept at %d tokens; want 1 at the billed 1334", n, cost)
	}
	// The next turn carries it, at the same place: the prefix holds.
	g.human("And now?")
	g.send(reply{})
	if !bytes.HasPrefix(g.sent[2], g.sent[1][:len(g.sent[1])-2]) || bytes.Count(g.sent[2], []byte(`"type":"image"`)) != 1 {
		t.Fatal("the kept image did not go on unchanged into the next turn")
	}
}

// Within a turn the switch changes no byte sent; at the next turn the
// image leaves (key_off) only where the switch was off.
func TestProxySwitchChangesNothingInsideTheTurn(t *testing.T) {
	run := func(keep string) *agent {
		g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
		g.header["X-Imgctx-Keep-Turn-Images"] = keep
		g.start()
		g.send(reply{tools: 1})
		g.results(1, false, false)
		g.send(reply{tools: 1})
		g.results(1, true, false)
		g.send(reply{})
		g.human("And now?")
		g.send(reply{})
		return g
	}
	on, off := run("on"), run("off")
	for i := range 3 {
		if !bytes.Equal(on.sent[i], off.sent[i]) {
			t.Fatalf("request %d of the turn differs with the switch on and off", i+1)
		}
	}
	if bytes.Count(on.sent[3], []byte(`"type":"image"`)) != 2 {
		t.Fatal("switch on: the next turn lost its kept images")
	}
	if bytes.Count(off.sent[3], []byte(`"type":"image"`)) != 0 || bytes.Count(off.sent[3], []byte(`[image removed]`)) != 2 || off.rig.counter("removed", "key_off") != 2 {
		t.Fatalf("switch off: the next turn still sends images: %d", bytes.Count(off.sent[3], []byte(`"type":"image"`)))
	}
}

// Over the budget an image stays ephemeral: sent through its turn, a
// marker from the next turn on, counted once as removed.
func TestProxyEphemeralBecomesAMarkerNextTurn(t *testing.T) {
	rig := newAgentRig(t, 20_000, &session.Mem{}) // budget 2,000: one screenshot
	var logs bytes.Buffer
	rig.log = slog.New(slog.NewJSONHandler(&logs, nil))
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	if bytes.Count(g.sent[2], []byte(`"type":"image"`)) != 2 {
		t.Fatal("an ephemeral image was not sent through its turn")
	}
	g.human("And now?")
	g.send(reply{})
	if bytes.Count(g.sent[3], []byte(`"type":"image"`)) != 1 || bytes.Count(g.sent[3], []byte(`[image removed]`)) != 1 || g.rig.counter("removed", "budget") != 1 {
		t.Fatalf("next turn: %s", g.sent[3][bytes.Index(g.sent[3], []byte(`"messages"`)):][:0])
	}
	if n := g.rig.counter("removed", "budget"); n != 1 {
		t.Fatalf("removed counted %d times; want once", n)
	}
	// One log line, for the request that removed it.
	rig.done.wait()
	if n := bytes.Count(logs.Bytes(), []byte(`"msg":"proxy: images removed"`)); n != 1 || !bytes.Contains(logs.Bytes(), []byte(`"reason_budget":1`)) {
		t.Fatalf("%d removal lines:\n%s", n, logs.Bytes())
	}
	g.human("Once more.")
	g.send(reply{})
	if !bytes.HasPrefix(g.sent[4], g.sent[3][:len(g.sent[3])-2]) || g.rig.counter("not_sent", "budget") != 2 {
		t.Fatalf("the marker did not stay, or was not counted on each request (%d)", g.rig.counter("not_sent", "budget"))
	}
}

// Prompt too long: one replay without the kept images, a body that
// differs; with nothing left to remove the upstream's error comes back at
// once, after one attempt.
func TestProxyOverflowReplaysOnlyADifferentBody(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	g.human("And now?")
	before := g.rig.up.calls
	g.rig.up.overflow = 1000 // the kept image alone is over
	g.send(reply{})
	if g.rig.up.calls-before != 2 || !bytes.Contains(g.sent[2], []byte(`[image removed]`)) || g.rig.counter("removed", "overflow") != 1 {
		t.Fatalf("%d upstream attempts; the replay: %v, %d removed (overflow)", g.rig.up.calls-before, bytes.Contains(g.sent[2], []byte(`[image removed]`)), g.rig.counter("removed", "overflow"))
	}
	g.rig.up.overflow = 10 // nothing imgctx could remove makes it fit
	g.human("Again?")
	before = g.rig.up.calls
	resp, body := g.post(reply{})
	if resp.StatusCode != 400 || g.rig.up.calls-before != 1 || !bytes.Contains(body, []byte("prompt is too long")) {
		t.Fatalf("%d after %d attempts: %s", resp.StatusCode, g.rig.up.calls-before, body)
	}
}

// Prompt too long where the conversation's text fills over half the
// window: removing its images would only put the client's compaction off,
// or the refusal its text soon brings a client that never compacts. The
// refusal is the client's, at once, after one attempt, and the image stays
// (claude-code 2.1.332 compacts on it).
func TestProxyOverflowOfATextFilledConversationIsTheClients(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Read this log."+strings.Repeat(" The build went on.", 24_000))
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	g.human("And now?")
	g.rig.up.mu.Lock()
	g.rig.up.overflow = sum(g.rig.up.prev) // without its image the request would fit
	g.rig.up.mu.Unlock()
	before := g.rig.up.calls
	resp, body := g.post(reply{})
	if resp.StatusCode != 400 || g.rig.up.calls-before != 1 || !bytes.Contains(body, []byte("prompt is too long")) || g.rig.counter("removed", "overflow") != 0 {
		t.Fatalf("%d after %d attempts, %d removed (overflow): %s", resp.StatusCode, g.rig.up.calls-before, g.rig.counter("removed", "overflow"), body)
	}
}

// proxy.client_window: a request whose history as the client sent it, the
// screenshot imgctx took out at the turn's start back in, is past the
// window, its text filling over half of it, is refused as the provider
// would have refused it without imgctx — Anthropic's prompt-too-long, the
// upstream not asked — so a client that compacts when refused compacts
// where it would have. Off, or at a sight above the default (the user
// pays to see more, and the compaction put off keeps more in sight), the
// request goes, as it fits without the screenshot.
func TestProxyClientWindowRefusesWhatTheProviderWouldHave(t *testing.T) {
	for _, c := range []struct {
		window bool
		sight  float64
		refuse bool
	}{{true, policy.DefaultSight, true}, {false, policy.DefaultSight, false}, {true, 2, false}} {
		on := c.refuse
		rig := newAgentRig(t, 20_000, &session.Mem{}) // budget 2,000: one screenshot
		rig.window, rig.sight = c.window, c.sight
		rig.restart(t)
		g := newAgent(t, rig, "Read this log."+strings.Repeat(" The build went on.", 3400))
		g.start()
		g.send(reply{tools: 1})
		g.results(1, false, false)
		g.send(reply{tools: 1})
		before := sum(rig.up.prev)
		g.results(1, false, false)
		g.send(reply{})
		last := sum(rig.up.prev) // two screenshots, the second over the budget
		shot := last - before
		// The next turn: the second screenshot is a marker upstream; the
		// human's words put the client's own history past the window, not
		// what imgctx sends.
		g.human(strings.Repeat("word ", 20_000-last+shot/2))
		calls := rig.up.calls
		resp, body := g.post(reply{})
		switch {
		case on && (resp.StatusCode != 400 || rig.up.calls != calls || !bytes.Contains(body, []byte(`"type":"invalid_request_error"`)) || !bytes.Contains(body, []byte("prompt is too long: "))):
			t.Fatalf("%+v: %d after %d upstream calls: %s", c, resp.StatusCode, rig.up.calls-calls, body)
		case !on && (resp.StatusCode != 200 || rig.up.calls != calls+1):
			t.Fatalf("%+v: %d after %d upstream calls: %s", c, resp.StatusCode, rig.up.calls-calls, body)
		case !on && !bytes.Contains(g.sent[len(g.sent)-1], []byte("[image removed")):
			t.Fatalf("%+v: the screenshot did not leave: nothing to bring back", c)
		}
	}
}

// A cut completion measures nothing: the image stays on trial and, never
// measured, leaves at the next turn (unmeasured).
func TestProxyCutCompletionIsNotMeasured(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{cut: true})
	if n, _ := kept(g.decisions()); n != 0 {
		t.Fatal("an image was kept from a cut completion's usage")
	}
	g.human("Go on.")
	g.send(reply{})
	if !bytes.Contains(g.sent[2], []byte(`[image removed]`)) || g.rig.counter("removed", "unmeasured") != 1 {
		t.Fatal("the never-measured image did not leave at the next turn")
	}
}

// A reminder text block beside a tool result does not start a turn: the
// screenshot the model asked for is sent, and kept.
func TestProxyReminderBesideAToolResultStaysInTheTurn(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
	g.start()
	g.send(reply{tools: 2}) // parallel calls
	g.results(1, true, false)
	g.send(reply{})
	if bytes.Count(g.sent[1], []byte(`"type":"image"`)) != 2 || bytes.Contains(g.sent[1], []byte("removed")) {
		t.Fatal("the images the model asked for did not reach it")
	}
	if n, cost := kept(g.decisions()); n != 2 || cost != 2*1334 {
		t.Fatalf("%d kept at %d; want both at 1334, shared pro rata", n, cost)
	}
}

// Killed and restarted mid-turn over its SQLite file, the gateway sends
// what an uninterrupted one sends: the decisions, the open turn's relays
// and the measurement base are all in the session store.
func TestProxyRestartMidTurnSendsTheSameBodies(t *testing.T) {
	script := func(g *agent, restart func()) {
		g.start()
		g.send(reply{tools: 2})
		g.results(2, true, false)
		g.send(reply{tools: 1})
		restart()
		g.results(1, false, false)
		g.send(reply{tools: 1})
		g.results(1, false, true)
		g.send(reply{})
		g.human("And the next page?")
		g.send(reply{tools: 1})
		g.results(1, false, false)
		g.send(reply{})
	}
	open := func(path string) session.Store {
		s, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dir := t.TempDir()
	steady := newAgent(t, newAgentRig(t, 30_000, open(filepath.Join(dir, "a.db"))), "Check the site.")
	script(steady, func() {})
	// The first process is abandoned, not closed: nothing is flushed for it.
	path := filepath.Join(dir, "b.db")
	rig := newAgentRig(t, 30_000, open(path))
	killed := newAgent(t, rig, "Check the site.")
	script(killed, func() {
		rig.sessions = open(path)
		rig.restart(t)
	})
	if len(steady.sent) != len(killed.sent) {
		t.Fatalf("%d requests against %d", len(killed.sent), len(steady.sent))
	}
	for i := range steady.sent {
		if !bytes.Equal(steady.sent[i], killed.sent[i]) {
			t.Fatalf("request %d differs after the restart", i+1)
		}
	}
	if !bytes.Contains(steady.sent[5], []byte("[image removed]")) {
		t.Fatal("the script should reach a turn with removals, or it proves little")
	}
}

// Two conversations keep two sets of decisions: behind one static
// X-Imgctx-Session when they open differently, and when they open alike
// (the same prompt in two folders) by the agent's own session ids —
// opencode's X-Session-Id here, as claude-code's do.
func TestProxyConversationsNeverMerge(t *testing.T) {
	for _, c := range []struct {
		name             string
		openA, openB     string
		header, idA, idB string
	}{
		{"static header", "Check the login page.", "Check the billing page.", "X-Imgctx-Session", "my-agent", "my-agent"},
		{"opencode sessions opened alike", "Check the login page.", "Check the login page.", "X-Session-Id", "ses_a1", "ses_b2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig := newAgentRig(t, 30_000, &session.Mem{})
			a, b := newAgent(t, rig, c.openA), newAgent(t, rig, c.openB)
			a.header[c.header], b.header[c.header] = c.idA, c.idB
			a.start()
			a.send(reply{tools: 1})
			a.results(2, false, false)
			a.send(reply{})
			b.start()
			b.send(reply{tools: 1})
			b.results(1, false, false)
			b.send(reply{})
			if n, _ := kept(a.decisions()); n != 2 {
				t.Fatalf("conversation a keeps %d", n)
			}
			if p := b.decisions(); len(p.Images) != 1 || p.Images[0].Keep != chat.Kept {
				t.Fatalf("conversation b holds a's decisions: %+v", p.Images)
			}
		})
	}
}

// A client value of any size costs a hash: 10,000 conversations each with
// its own 64 KB session id leave the gateway's heap where it was (a bounded
// number of conversations is held in memory, the rest is on disk, keyed by
// 64 hex digits).
func TestProxyLargeSessionIDsLeaveMemoryFlat(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("10,000 requests: a test of volume, run without -short and -race")
	}
	dir := t.TempDir()
	store, err := sqlite.Open(filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	rig := newAgentRig(t, 200_000, store)
	rig.cached = 512
	rig.restart(t)
	body := []byte(`{"model":"agent-1","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	send := func(from, to int) {
		id := bytes.Repeat([]byte("s"), 64<<10)
		for i := from; i < to; i++ {
			copy(id, fmt.Sprintf("%08d", i))
			req, _ := http.NewRequest("POST", rig.srv.URL+"/v1/messages", bytes.NewReader(body))
			req.Header.Set("X-Imgctx-Session", string(id))
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("request %d: %d", i, resp.StatusCode)
				return
			}
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	send(0, 1000) // past the 512 conversations held in memory
	before := heap()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() { send(1000+w*2500, 1000+(w+1)*2500) })
	}
	wg.Wait()
	if after := heap(); after > before+2<<20 {
		t.Fatalf("heap grew from %d to %d bytes over 10,000 conversations", before, after)
	}
	// Measured once the store is closed: closing checkpoints the WAL, whose
	// size under load says how busy the machine was, not what was kept.
	rig.srv.Close()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	var disk int64
	for _, f := range []string{"s.db", "s.db-wal"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err == nil {
			disk += fi.Size()
		}
	}
	t.Logf("%d bytes on disk", disk)
	if disk > 16<<20 { // the raw ids alone would be 655 MB
		t.Fatalf("the decisions of 10,500 conversations take %d bytes on disk", disk)
	}
}

// Before a provider compaction block the provider reads nothing, so the
// images there are not sent (reason compaction) and counted.
func TestProxyImagesBeforeACompactionBlockAreNotSent(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Look at this.")
	raw, _ := samplePNG(t)
	data := base64.StdEncoding.EncodeToString(raw)
	g.msgs = []string{
		`{"role":"user","content":[{"type":"text","text":"Look at this."},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}]}`,
		`{"role":"assistant","content":[{"type":"text","text":"A login form."}]}`,
		`{"role":"user","content":[{"type":"text","text":"Go on."}]}`,
		`{"role":"assistant","content":[{"type":"compaction","content":"The user showed a login form."},{"type":"text","text":"Going on."}]}`,
		`{"role":"user","content":[{"type":"text","text":"And then?"}]}`,
	}
	g.send(reply{})
	sent := g.sent[0]
	if bytes.Contains(sent, []byte(data[:200])) || !bytes.Contains(sent, []byte(`[image removed]`)) || g.rig.counter("removed", "compaction") == 0 {
		t.Fatal("an image before the compaction block was sent")
	}
	if !bytes.Contains(sent, []byte(`{"type":"compaction","content":"The user showed a login form."}`)) {
		t.Fatal("the compaction block did not pass as it came")
	}
	if n := g.rig.counter("not_sent", "compaction"); n != 1 {
		t.Fatalf("counted %d images not sent for compaction; want 1", n)
	}
	g.human("More?")
	g.send(reply{})
	if g.rig.counter("not_sent", "compaction") != 2 || g.rig.counter("removed", "compaction") != 1 {
		t.Fatal("the image is not sent on every request, and removed once")
	}
}

// refusingStore is an image store whose disk is full.
type refusingStore struct{ imagestore.Store }

func (refusingStore) Put(context.Context, string, blob.Ref, []byte) error {
	return errors.New("no space left on device")
}

// A tool image the store refuses is no error on the drop-in route either:
// it goes as it came through its turn, and is a marker (refused) after.
func TestProxyStoreRefusalLeavesTheToolImageEphemeral(t *testing.T) {
	rig := newAgentRig(t, 200_000, &session.Mem{})
	rig.images = refusingStore{rig.images}
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{tools: 1})
	g.results(0, false, false)
	g.send(reply{})
	if bytes.Count(g.sent[1], []byte(`"type":"image"`)) != 1 || bytes.Count(g.sent[2], []byte(`"type":"image"`)) != 1 {
		t.Fatal("the refused tool image was not sent through its turn")
	}
	g.human("And now?")
	g.send(reply{})
	if bytes.Count(g.sent[3], []byte(`(refused)]`)) != 1 {
		t.Fatal("no refused marker at the next turn")
	}
}

// Issue "Drop-in that survives agents changing", item 1, as claude-code
// 2.1.197 sends it: the first user message carries cache_control in the
// first request only (it is then the last message). One conversation
// still: the screenshot first shown in request 2 is measured there and
// kept at the next turn, not removed as unmeasured.
func TestProxyCacheControlMovedOffTheOpeningKeepsOneConversation(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 200_000, &session.Mem{}), "Open the login page.")
	g.msgs = append(g.msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"}}]}`, g.first))
	g.send(reply{tools: 1})
	g.msgs[0] = fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q}]}`, g.first)
	g.results(1, false, false)
	g.send(reply{})
	g.human("And now?")
	g.send(reply{})
	if n, cost := kept(g.decisions()); n != 1 || cost != 1334 {
		t.Fatalf("%d kept at %d tokens; want the screenshot kept at its measured 1334", n, cost)
	}
	if bytes.Count(g.sent[2], []byte(`"type":"image"`)) != 1 || bytes.Contains(g.sent[2], []byte("[image removed")) {
		t.Fatal("the next turn lost the screenshot")
	}
}

// proxy.max_images bounds what a conversation's decisions hold: past it
// they start over, with a warning, and the conversation goes on — its
// requests answered, its images decided afresh.
func TestProxyDecisionsStartOverPastTheirCap(t *testing.T) {
	rig := newAgentRig(t, 200_000, &session.Mem{})
	var logs bytes.Buffer
	rig.log = slog.New(slog.NewJSONHandler(&logs, nil))
	rig.imageCap = 2
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.start()
	for range 2 {
		g.send(reply{tools: 1})
		g.results(1, false, false)
	}
	g.send(reply{})
	if n := len(g.decisions().Images); n != 2 {
		t.Fatalf("%d decisions under the cap of 2, want both", n)
	}
	g.human("One more.")
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	if d := g.decisions(); len(d.Images) != 0 || d.TurnAt != -1 {
		t.Fatalf("past the cap the decisions hold %d images, turn at %d; want none, started over", len(d.Images), d.TurnAt)
	}
	rig.done.wait()
	if !bytes.Contains(logs.Bytes(), []byte(`"msg":"proxied conversation over its decision cap: its decisions start over"`)) || !bytes.Contains(logs.Bytes(), []byte(`"cap":2`)) {
		t.Fatalf("no warning for the cap:\n%s", logs.Bytes())
	}
	g.human("Still there?")
	g.send(reply{})
	if n := bytes.Count(g.sent[len(g.sent)-1], []byte(`"type":"image"`)); n != 3 {
		t.Fatalf("after starting over, %d of the 3 screenshots sent", n)
	}
}

// At a sight that holds every screenshot, the window fills with them while
// the text is short. A client that compacts when refused (client_window
// on) gets the provider's refusal there, its compaction cheaper than the
// relief (policy.Costs.CompactionPays): the request goes up once, is not
// replayed without the images, and none leaves. A client that sends the
// refused history again did not compact: it gets the relief. Off, the
// relief takes the images out at once and the request is answered.
func TestProxyWindowLeftToAClientThatCompacts(t *testing.T) {
	for _, c := range []struct {
		window   bool
		overflow int // where the upstream refuses; 0: the window
	}{{true, 0}, {false, 0}, {true, 24_000}} {
		// At 24,000 the upstream takes requests past the window as imgctx
		// counts it: left to a client that never saw a refusal, they say
		// nothing of whether it compacts.
		window := c.window
		rig := newAgentRig(t, 20_000, &session.Mem{})
		rig.up.overflow = c.overflow
		var logs bytes.Buffer
		rig.window, rig.hold, rig.sight = window, true, 100
		rig.log = slog.New(slog.NewJSONHandler(&logs, nil))
		rig.restart(t)
		g := newAgent(t, rig, "Check every page of the site."+strings.Repeat(" Look closely.", 1000))
		g.start()
		g.send(reply{tools: 1})
		var resp *http.Response
		var body []byte
		calls := 0
		for range 20 {
			g.results(2, false, false)
			calls = rig.up.calls
			resp, body = g.post(reply{tools: 1})
			if resp.StatusCode != 200 || rig.counter("removed", "window") > 0 {
				break
			}
		}
		switch removed := rig.counter("removed", "window"); {
		case window && (resp.StatusCode != 400 || rig.up.calls != calls+1 || removed != 0 || !bytes.Contains(body, []byte("prompt is too long"))):
			t.Fatalf("on: %d after %d upstream calls, %d removed for the window: %s", resp.StatusCode, rig.up.calls-calls, removed, body)
		case !window && (resp.StatusCode != 200 || removed == 0):
			t.Fatalf("off: %d, %d removed for the window: %s", resp.StatusCode, removed, body)
		case window != strings.Contains(logs.String(), "refusal left to the client"):
			t.Fatalf("window %v: the log says: %s", window, logs.String())
		}
		if window {
			rig.restart(t) // what was left to the client is the conversation's, in its store
			if resp, body = g.post(reply{}); resp.StatusCode != 200 || rig.counter("removed", "window") == 0 {
				t.Fatalf("sent again: %d, %d removed for the window: %s", resp.StatusCode, rig.counter("removed", "window"), body)
			}
		}
	}
}
