package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/imgctx/imgctx/session"
	"pgregory.net/rapid"
)

// historyImages counts the images an upstream body sends before its last
// human message (one not made only of tool results and reminders): the
// images earlier turns kept.
func historyImages(t tester, body []byte) int {
	var r struct {
		Messages []struct {
			Role    string `json:"role"`
			Content []struct {
				Type    string            `json:"type"`
				Content []json.RawMessage `json:"content"`
			} `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	last := -1
	for i, m := range r.Messages {
		human := m.Role == "user"
		for _, b := range m.Content {
			human = human && b.Type != "tool_result"
		}
		if human {
			last = i
		}
	}
	n := 0
	for _, m := range r.Messages[:max(last, 0)] {
		for _, b := range m.Content {
			n += bytes.Count(bytes.Join(rawAll(b.Content), nil), []byte(`"type":"image"`))
			if b.Type == "image" {
				n++
			}
		}
	}
	return n
}

func rawAll(rs []json.RawMessage) [][]byte {
	out := make([][]byte, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out
}

// Generated agent tool loops — screenshots in tool results, reminders beside
// them, parallel calls, the same screenshot again, new human turns, gateway
// restarts — hold the invariants of the proxied turn: each request's body
// begins with the previous one's except at a batch of removals; there is at
// most one batch per human turn; the kept images of earlier turns never
// cost more than the budget; every image the client sent is sent or counted
// as not sent with a reason.
func TestProxyAgentLoopsHoldTheirInvariants(t *testing.T) {
	if raceEnabled {
		t.Skip("sequential: the race detector finds nothing here and makes it ten times slower")
	}
	const shot = 1334 // a 1280×800 screenshot on Claude's rule
	rapid.Check(t, func(rt *rapid.T) {
		window := rapid.SampledFrom([]int{30_000, 60_000, 200_000}).Draw(rt, "window")
		rig := newAgentRig(t, window, &session.Mem{})
		g := newAgent(t, rig, fmt.Sprintf("Task %d", rapid.Int().Draw(rt, "task")))
		g.t = rt
		budget := window / 10
		turns, batches, turnImages := 1, 0, 0
		removed, notSent := 0, 0
		next := func() reply {
			if turnImages*shot > window/3 {
				return reply{} // the turn's own images would not fit: the agent stops
			}
			return reply{tools: rapid.IntRange(0, 2).Draw(rt, "tools")}
		}
		check := func() {
			i := len(g.sent) - 1
			r, ns := rig.counter("removed", "*"), rig.counter("not_sent", "*")
			batch := r > removed
			if batch {
				batches++
			}
			if i > 0 && !batch && !bytes.HasPrefix(g.sent[i], g.sent[i-1][:len(g.sent[i-1])-2]) {
				rt.Fatalf("request %d changed the prefix without removing anything", i+1)
			}
			if sent := bytes.Count(g.sent[i], []byte(`"type":"image"`)); sent+ns-notSent != g.images[i] {
				rt.Fatalf("request %d: the client sent %d images, %d went, %d counted as not sent", i+1, g.images[i], sent, ns-notSent)
			}
			if k := historyImages(rt, g.sent[i]); k*shot > budget {
				rt.Fatalf("request %d: %d kept images of earlier turns cost %d, over the budget %d", i+1, k, k*shot, budget)
			}
			removed, notSent = r, ns
		}
		g.start()
		g.send(next())
		check()
		for range rapid.IntRange(1, 24).Draw(rt, "steps") {
			if rapid.IntRange(0, 9).Draw(rt, "restart") == 0 {
				rig.restart(t)
				removed, notSent = 0, 0 // a new process counts from zero
			}
			if len(g.pending) > 0 {
				each := rapid.IntRange(0, 2).Draw(rt, "shots")
				turnImages += each * len(g.pending)
				g.results(each, rapid.Bool().Draw(rt, "reminder"), rapid.IntRange(0, 4).Draw(rt, "repeat") == 0)
			} else {
				g.human(fmt.Sprintf("Next step %d.", turns))
				turns++
				turnImages = 0
			}
			g.send(next())
			check()
		}
		if batches > turns {
			rt.Fatalf("%d removal batches in %d turns: at most one a turn", batches, turns)
		}
	})
}
