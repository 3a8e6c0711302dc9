package engine

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
)

// BenchmarkSessionTurns plays a 310-turn sessions-API conversation on
// SQLite against an upstream that answers at once (it reads the body and
// writes a fixed answer), and reports the median time of a turn — the
// engine's overhead, the upstream's nearly nothing — over turns 11–70 and
// 251–310: a turn should cost what is new, not what came before.
func BenchmarkSessionTurns(b *testing.B) {
	const turns = 310
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"scripted-vl","content":[{"type":"text","text":"`+
			strings.Repeat("The form is filled in and the next step is the checkout page. ", 8)+
			`"}],"stop_reason":"end_turn","usage":{"input_tokens":40,"cache_read_input_tokens":900,"cache_creation_input_tokens":60,"output_tokens":120}}`)
	}))
	defer up.Close()
	ask := strings.Repeat("Open the settings page and change the billing address to the new one. ", 6)
	var early, late []time.Duration
	for b.Loop() {
		dir := b.TempDir()
		fsys, err := imagestore.NewFS(dir + "/images")
		if err != nil {
			b.Fatal(err)
		}
		sessions, err := openSessions(dir)
		if err != nil {
			b.Fatal(err)
		}
		tbl, _ := tokens.Default().With(testProfile(1_000_000))
		e := &Engine{Images: imagestore.Verified{Store: fsys}, Sessions: sessions, Profiles: tbl,
			Upstream: &upstream.Client{Format: upstream.Anthropic, BaseURL: up.URL, APIKey: "k"}}
		m, err := e.NewSession(b.Context(), "acme", chat.Settings{Model: "scripted-vl", KeepTurnImages: true}, chat.Main)
		if err != nil {
			b.Fatal(err)
		}
		for turn := 1; turn <= turns; turn++ {
			msgs := user(fmt.Sprintf("%d. %s", turn, ask))
			start := time.Now()
			if _, err := e.Call(b.Context(), "acme", m.ID, msgs); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			switch {
			case turn > 10 && turn <= 70:
				early = append(early, took)
			case turn > 250:
				late = append(late, took)
			}
		}
		sessions.Close()
	}
	b.ReportMetric(float64(median(early).Microseconds())/1000, "ms/turn-11-70")
	b.ReportMetric(float64(median(late).Microseconds())/1000, "ms/turn-251-310")
	b.ReportMetric(0, "ns/op")
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
