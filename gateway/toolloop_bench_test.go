package gateway

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/imgctx/imgctx/session"
)

// keepNewest is the eviction agents and gateways commonly do: every image
// but the newest n becomes a placeholder, on every request.
func keepNewest(n int) func([]byte) []byte {
	return func(body []byte) []byte {
		var r map[string]any
		json.Unmarshal(body, &r)
		msgs, _ := r["messages"].([]any)
		seen := 0
		var visit func(blocks []any)
		visit = func(blocks []any) {
			for i := len(blocks) - 1; i >= 0; i-- {
				b, _ := blocks[i].(map[string]any)
				switch b["type"] {
				case "tool_result":
					if c, ok := b["content"].([]any); ok {
						visit(c)
					}
				case "image":
					if seen++; seen > n {
						blocks[i] = map[string]any{"type": "text", "text": "[image removed]"}
					}
				}
			}
		}
		for i := len(msgs) - 1; i >= 0; i-- {
			m, _ := msgs[i].(map[string]any)
			if c, ok := m["content"].([]any); ok {
				visit(c)
			}
		}
		out, _ := json.Marshal(r)
		return out
	}
}

// toolLoop is a scenario: turns of tool calls, each returning one 1280×800
// screenshot; idleEvery > 0 leaves the conversation idle past the cache
// TTL before every idleEvery-th turn.
type toolLoop struct {
	turns, shotsPerTurn, idleEvery int
}

func (s toolLoop) run(b *testing.B, lowWater float64, hold bool, direct func([]byte) []byte) *pricedUpstream {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	rig := &agentRig{profile: agentProfile(200_000), sessions: &session.Mem{}, lowWater: lowWater, hold: hold, clock: func() time.Time { return now }}
	rig.images = newAgentRig(b, 200_000, rig.sessions).images
	rig.up = newPriced(b, rig.profile)
	rig.restart(b)
	g := newAgent(b, rig, "Test the checkout flow, screen by screen.")
	g.direct = direct
	for turn := range s.turns {
		if turn > 0 {
			if s.idleEvery > 0 && turn%s.idleEvery == 0 {
				now = now.Add(10 * time.Minute)
				rig.up.expire()
			}
			g.human(fmt.Sprintf("Now step %d.", turn+1))
		} else {
			g.start()
		}
		for range s.shotsPerTurn {
			g.send(reply{tools: 1})
			g.results(1, false, false)
			now = now.Add(5 * time.Second)
		}
		g.send(reply{})
	}
	return rig.up
}

// BenchmarkToolLoopCache replays screenshot tool loops (200k window, the
// default budget of 20,000 tokens: fourteen 1,334-token screenshots)
// through imgctx and against "keep the newest 3", and reports what the
// emulated provider cache saw: requests whose body does not begin with
// the previous one's (prefix breaks), and tokens written to and read from
// the cache. The time per op is not the point.
//
//	go test ./gateway -run XXX -bench ToolLoopCache -benchtime 1x
func BenchmarkToolLoopCache(b *testing.B) {
	scenarios := []struct {
		name string
		loop toolLoop
	}{
		{"40 screenshots in one turn", toolLoop{turns: 1, shotsPerTurn: 40}},
		{"40 screenshots over 10 turns", toolLoop{turns: 10, shotsPerTurn: 4}},
		{"40 over 10 turns, idle past the TTL every 3rd", toolLoop{turns: 10, shotsPerTurn: 4, idleEvery: 3}},
		{"80 over 20 turns, idle past the TTL every 4th", toolLoop{turns: 20, shotsPerTurn: 4, idleEvery: 4}},
	}
	policies := []struct {
		name     string
		lowWater float64
		hold     bool
		direct   func([]byte) []byte
	}{
		{"imgctx keep.hold", 0.5, true, nil},
		{"imgctx low_water=0.5", 0.5, false, nil},
		{"imgctx low_water=0.25", 0.25, false, nil},
		{"imgctx low_water=0.75", 0.75, false, nil},
		{"imgctx low_water=0.9", 0.9, false, nil},
		{"keep newest 3", 0, false, keepNewest(3)},
		{"keep everything", 0, false, func(b []byte) []byte { return b }},
	}
	for _, sc := range scenarios {
		for _, p := range policies {
			b.Run(sc.name+"/"+p.name, func(b *testing.B) {
				var up *pricedUpstream
				for range b.N {
					up = sc.loop.run(b, p.lowWater, p.hold, p.direct)
				}
				b.ReportMetric(float64(up.answered), "requests")
				b.ReportMetric(float64(up.breaks), "prefix_breaks")
				b.ReportMetric(float64(up.written), "cache_written_tokens")
				b.ReportMetric(float64(up.read), "cache_read_tokens")
				last, images := up.last()
				_ = last
				b.ReportMetric(float64(images/1334), "images_in_last_request")
			})
		}
	}
}
