package sim

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
)

// The sessions API gives its breakpoints the one-hour lifetime where the
// pace pays for it: a conversation whose turns come 8 minutes apart (past
// the 5-minute lifetime) costs less with it, on the emulated provider's
// bills, and one whose turns come a minute apart never writes for an hour
// and costs the same.
func TestTheHourCachePaysOnlyWhenTurnsComeSlowly(t *testing.T) {
	profile, _ := tokens.Default().Lookup("claude-sonnet-4-6")
	pr := profile.Prices
	run := func(gap time.Duration, hour bool) (dollars float64, hourWrites, hits int) {
		ctx := context.Background()
		clock := NewClock()
		prov := NewProvider(profile, clock, nil)
		client := &upstream.Client{Format: upstream.Anthropic, BaseURL: "http://provider.sim", HTTP: &http.Client{Transport: prov.Transport()}, MaxRetries: -1}
		e := &engine.Engine{Config: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: 1, HourCache: hour}},
			Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tokens.Default(), Upstream: client,
			Now: clock.Now, Log: slog.New(slog.DiscardHandler)}
		meta, err := e.NewSession(ctx, "t", chat.Settings{Model: profile.Name}, chat.Main)
		if err != nil {
			t.Fatal(err)
		}
		g := &gen{rng: newRand(7)}
		for turn := range 12 {
			var in []chat.Message
			if turn == 0 {
				in = append(in, chat.Message{Role: chat.System, Parts: []chat.Part{chat.Text{Text: g.words(3000)}}})
			} else {
				clock.Advance(gap)
			}
			in = append(in, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: fmt.Sprintf("turn %d: %s", turn, g.words(2000))}}})
			if _, err := e.Call(ctx, "t", meta.ID, in); err != nil {
				t.Fatalf("turn %d: %v", turn, err)
			}
		}
		for _, b := range prov.Bills() {
			dollars += (float64(b.Input)*pr.Input + float64(b.CacheRead)*pr.CacheRead + float64(b.CacheWrite)*pr.CacheWrite +
				float64(b.CacheWrite1h)*pr.CacheWrite1h + float64(b.Output)*pr.Output) / 1e6
			hourWrites += b.CacheWrite1h
			hits += b.CacheRead
		}
		return dollars, hourWrites, hits
	}
	slowOff, _, _ := run(8*time.Minute, false)
	slowOn, hourWrites, _ := run(8*time.Minute, true)
	if hourWrites == 0 || slowOn >= slowOff*0.9 {
		t.Fatalf("turns 8 minutes apart: $%.4f with the hour cache (%d tokens written for an hour), $%.4f without; want at least 10%% less", slowOn, hourWrites, slowOff)
	}
	fastOff, _, _ := run(time.Minute, false)
	fastOn, hourWrites, _ := run(time.Minute, true)
	if hourWrites != 0 || fastOn != fastOff {
		t.Fatalf("turns a minute apart: $%.4f with the hour cache (%d tokens written for an hour), $%.4f without; want it unused", fastOn, hourWrites, fastOff)
	}
	t.Logf("12 turns 8 minutes apart: $%.4f with the hour cache, $%.4f without; a minute apart: $%.4f both", slowOn, slowOff, fastOn)
}
