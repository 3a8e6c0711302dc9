package sim

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/gateway"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/internal/testsvc"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/postgres"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The request log says what the provider billed: a computer-use
// conversation with idle gaps and removals, through the gateway to the
// emulated provider, on SQLite and on PostgreSQL. Each line's tokens are
// the bill's, its dollars the bill at the profile's prices, its images
// the ones the bill counted, and its prefix break the one the provider
// saw, with the same cause.
func TestRequestLogMatchesTheBills(t *testing.T) {
	stores := map[string]func(t *testing.T) session.Store{
		"sqlite": func(t *testing.T) session.Store {
			s, err := sqlite.Open(filepath.Join(t.TempDir(), "imgctx.db"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"postgres": func(t *testing.T) session.Store {
			dsn := testsvc.Schema(t)
			s, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			defer store.Close()
			requestLogAgainstBills(t, store)
		})
	}
}

func requestLogAgainstBills(t *testing.T, store session.Store) {
	ctx := context.Background()
	profile, _ := tokens.Default().Lookup("claude-sonnet-4-6")
	p := DefaultParams("computer-use")
	p.Turns, p.IdleEvery, p.ImageKB = 12, 5, 0
	w, err := Build("computer-use", p)
	if err != nil {
		t.Fatal(err)
	}
	clock := NewClock()
	prov := NewProvider(profile, clock, nil)
	client := &upstream.Client{Format: upstream.Anthropic, BaseURL: "http://provider.sim", HTTP: &http.Client{Transport: prov.Transport()}, MaxRetries: -1}
	e := &engine.Engine{Config: engine.Config{Keep: policy.KeepConfig{BudgetFraction: 0.02, Hold: true, Sight: 0}},
		Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: store, Profiles: tokens.Default(), Upstream: client,
		Now: clock.Now, Log: slog.New(slog.DiscardHandler)}
	srv := gateway.New(gateway.Config{RequestLog: true}, e, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	h := srv.Handler()
	var transcript []Msg
	var buf bytes.Buffer
	for i, st := range w.Steps {
		clock.Advance(st.Think)
		transcript = append(transcript, cloneMsgs(st.Add)...)
		body := renderInto(&buf, "anthropic", "claude-sonnet-4-6", w.System, w.Tools, transcript, false, lastBreakpoint)
		req := httptest.NewRequestWithContext(ctx, "POST", "/v1/messages", bytes.NewReader(body))
		req.Header = http.Header{"Content-Type": {"application/json"}, "Anthropic-Version": {"2023-06-01"},
			"X-Imgctx-Session": {"log-test"}, "X-Request-Id": {fmt.Sprintf("step-%03d", i)}}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || rec.Header().Get("X-Imgctx-Request-Id") != fmt.Sprintf("step-%03d", i) {
			t.Fatalf("step %d: %d, request id %q: %s", i, rec.Code, rec.Header().Get("X-Imgctx-Request-Id"), rec.Body.Bytes())
		}
	}
	srv.Close() // the last lines written
	bills := prov.Bills()
	if len(bills) != len(w.Steps) {
		t.Fatalf("%d bills for %d requests: a replay the test does not expect", len(bills), len(w.Steps))
	}
	lines, err := store.ListRequests(ctx, session.RequestFilter{Tenant: "default"})
	if err != nil || len(lines) != len(w.Steps) {
		t.Fatalf("%v: %d lines for %d requests", err, len(lines), len(w.Steps))
	}
	pr := profile.Prices
	var breaks, removed int
	causes := map[string]int{}
	for i, b := range bills {
		l := lines[len(lines)-1-i] // newest first
		if l.ID != fmt.Sprintf("step-%03d", i) {
			t.Fatalf("line %d is %s", i, l.ID)
		}
		want := (float64(b.Input)*pr.Input + float64(b.CacheRead)*pr.CacheRead + float64(b.CacheWrite)*pr.CacheWrite + float64(b.Output)*pr.Output) / 1e6
		sent := 0
		for _, img := range l.Images {
			if img.Sent {
				sent++
			}
		}
		switch {
		case l.Input != b.Prompt || l.CacheRead != b.CacheRead || l.CacheWrite != b.CacheWrite+b.CacheWrite1h || l.Output != b.Output:
			t.Errorf("%s: tokens %d/%d/%d/%d, billed %d/%d/%d/%d", l.ID, l.Input, l.CacheRead, l.CacheWrite, l.Output, b.Prompt, b.CacheRead, b.CacheWrite+b.CacheWrite1h, b.Output)
		case !l.Priced || math.Abs(l.Dollars-want) > 1e-9:
			t.Errorf("%s: $%.6f (priced %v), billed $%.6f", l.ID, l.Dollars, l.Priced, want)
		case sent != b.Images:
			t.Errorf("%s: %d images sent by the log, %d billed", l.ID, sent, b.Images)
		case l.Break != b.Break || l.Break && l.BreakCause != b.BreakCause:
			t.Errorf("%s: break %v (%s), the provider saw %v (%s)", l.ID, l.Break, l.BreakCause, b.Break, b.BreakCause)
		case l.Status != 200 || l.Model != "claude-sonnet-4-6" || l.Profile != profile.Name || l.Conversation == "" || l.Route != "messages" || l.BytesIn == 0 || l.BytesOut == 0 || l.DurationMS <= 0:
			l.Images = nil
			t.Errorf("%s: %+v", l.ID, l)
		}
		if len(l.Images)-sent > 0 && l.Conversation != lines[0].Conversation {
			t.Errorf("%s: another conversation", l.ID)
		}
		removed += l.Removed
		if l.Break {
			breaks++
			causes[l.BreakCause]++
		}
	}
	if removed == 0 || causes["image"] == 0 || causes["expired"] == 0 {
		t.Fatalf("the conversation should remove images and break the cache by removal and by idling: %d removed, breaks %v", removed, causes)
	}
	t.Logf("%d requests, %d removed, breaks %v", len(bills), removed, causes)
}
