package gateway

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
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
func (g *agent) decisions() session.Proxied {
	g.t.Helper()
	sp, err := anthropic.Scan(g.body(), wire.ScanOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	h := http.Header{}
	for k, v := range g.header {
		h.Set(k, v)
	}
	p, err := g.rig.sessions.LoadProxied(context.Background(), "default", conversationKey("default", upstream.Anthropic, h, sp))
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
	if bytes.Count(off.sent[3], []byte(`"type":"image"`)) != 0 || bytes.Count(off.sent[3], []byte(`(key_off)]`)) != 2 {
		t.Fatalf("switch off: the next turn still sends images: %d", bytes.Count(off.sent[3], []byte(`"type":"image"`)))
	}
}

// Over the budget an image stays ephemeral: sent through its turn, a
// marker from the next turn on, counted once as removed.
func TestProxyEphemeralBecomesAMarkerNextTurn(t *testing.T) {
	g := newAgent(t, newAgentRig(t, 20_000, &session.Mem{}), "Open the login page.") // budget 2,000: one screenshot
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
	if bytes.Count(g.sent[3], []byte(`"type":"image"`)) != 1 || bytes.Count(g.sent[3], []byte(`[image removed: image/png (budget)]`)) != 1 {
		t.Fatalf("next turn: %s", g.sent[3][bytes.Index(g.sent[3], []byte(`"messages"`)):][:0])
	}
	if n := g.rig.counter("removed", "budget"); n != 1 {
		t.Fatalf("removed counted %d times; want once", n)
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
	if g.rig.up.calls-before != 2 || !bytes.Contains(g.sent[2], []byte(`(overflow)]`)) {
		t.Fatalf("%d upstream attempts; the replay: %v", g.rig.up.calls-before, bytes.Contains(g.sent[2], []byte(`(overflow)]`)))
	}
	g.rig.up.overflow = 10 // nothing imgctx could remove makes it fit
	g.human("Again?")
	before = g.rig.up.calls
	resp, body := g.post(reply{})
	if resp.StatusCode != 400 || g.rig.up.calls-before != 1 || !bytes.Contains(body, []byte("prompt is too long")) {
		t.Fatalf("%d after %d attempts: %s", resp.StatusCode, g.rig.up.calls-before, body)
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
	if !bytes.Contains(g.sent[2], []byte(`(unmeasured)]`)) {
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
