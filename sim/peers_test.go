package sim

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/imgctx/imgctx/tokens"
)

// Each peer's removal schedule, by hand, on a transcript growing one tool
// screenshot at a time.
func TestPeerRemovalSchedules(t *testing.T) {
	peer := func(name string) Peer {
		for _, p := range Peers(3, 10, 5) {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no peer %s", name)
		return Peer{}
	}
	for _, c := range []struct {
		peer string
		// removed[i]: images removed in all after the (i+1)th screenshot
		at      map[int]int
		dropped bool
	}{
		// N=3, chunk 10: nothing until 13 images, then 10 at once.
		{"chunked-3/10", map[int]int{12: 0, 13: 10, 22: 10, 23: 20}, true},
		{"ref-loop", map[int]int{3: 0, 4: 0, 5: 0, 6: 3, 8: 3, 9: 6}, true},
		{"newest-3/1", map[int]int{3: 0, 4: 1, 5: 2, 10: 7}, false},
		{"osworld-10/20", map[int]int{29: 0, 30: 20, 49: 20, 50: 40}, true},
		{"ceiling-batch-5", map[int]int{100: 0, 101: 96}, false},
		{"strip-on-compact", map[int]int{150: 0}, false},
		{"opencode", map[int]int{150: 0}, false},
	} {
		p := peer(c.peer)
		r := &runner{peer: p, removed: map[string]int{}, cfg: Config{Profile: tokens.Profile{Limits: tokens.Limits{MaxImages: 100}}}}
		im := &Image{ID: 1, W: 8, H: 8}
		for n := 1; n <= 150; n++ {
			r.transcript = append(r.transcript, Msg{Role: "user", Parts: []Part{{Result: &Result{CallID: "c", Parts: []Part{{Text: "shot"}, {Image: im}}}}}})
			r.evict()
			removed := 0
			for _, k := range r.removed {
				removed += k
			}
			if want, ok := c.at[n]; ok && removed != want {
				t.Errorf("%s: %d removed after %d screenshots; want %d", c.peer, removed, n, want)
			}
			if kept := countImages(r.transcript, false); kept+removed != n {
				t.Fatalf("%s: %d kept + %d removed ≠ %d", c.peer, kept, removed, n)
			}
		}
		placeholders := 0
		for _, m := range r.transcript {
			for _, in := range m.Parts[0].Result.Parts {
				if in.Removed != "" {
					placeholders++
				}
			}
		}
		if c.dropped != (placeholders == 0) && r.removed != nil && len(r.removed) > 0 {
			t.Errorf("%s: %d placeholders; dropped %v", c.peer, placeholders, c.dropped)
		}
	}
}

// smallTrace is a computer-use workload of a few turns, small synthetic
// images, 2-minute turn gaps and a 6-minute idle gap (past the cache TTL)
// every idleEvery turns.
func smallTrace(t *testing.T, turns, shots, idleEvery int) *Workload {
	t.Helper()
	p := DefaultParams("computer-use")
	p.Turns, p.ImagesPerTurn, p.ImageKB, p.IdleEvery, p.TurnGap, p.Idle = turns, shots, 0, idleEvery, 2*time.Minute, 6*time.Minute
	w, err := Build("computer-use", p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The frontier's dynamic programme finds the best schedule: on small
// traces, every schedule (how many of the oldest images are gone after
// each request) is enumerated and none does better, at every price put on
// an image.
func TestFrontierMatchesBruteForce(t *testing.T) {
	for _, prof := range []tokens.Profile{sonnet(t), gpt4o(t)} {
		w := smallTrace(t, 3, 2, 2)
		tr, err := newTrace(w, prof)
		if err != nil {
			t.Fatal(err)
		}
		s := tr.sums()
		steps := len(tr.end)
		perImage := float64(s.saved[len(tr.items)]) / float64(len(tr.items)) * prof.Prices.Input / 1e6
		for _, lambda := range []float64{0, 0.05 * perImage, 0.2 * perImage, perImage, 5 * perImage} {
			_, _, _, got := tr.best(s, lambda)
			want := math.Inf(1)
			sched := make([]int, steps)
			var walk func(i, prev int)
			walk = func(i, prev int) {
				if i == steps {
					c, shown := tr.price(s, sched)
					if v := c - lambda*float64(shown); v < want {
						want = v
					}
					return
				}
				for k := prev; k <= tr.arrived(tr.end[i]); k++ {
					sched[i] = k
					walk(i+1, k)
				}
			}
			walk(0, 0)
			if math.Abs(got-want) > 1e-12 {
				t.Errorf("%s, λ=%g: the programme found %.9f, the best of all schedules is %.9f", prof.Name, lambda, got, want)
			}
		}
	}
}

func gpt4o(t *testing.T) tokens.Profile {
	p, ok := tokens.Default().Lookup("gpt-4o")
	if !ok || p.Prices == nil {
		t.Fatal("gpt-4o has no profile with prices")
	}
	return p
}

// The frontier's cost model is the emulator's: each frontier point's
// schedule, played as a policy against the emulated provider, costs what
// the programme computed for it.
func TestFrontierCostsWhatTheEmulatorBills(t *testing.T) {
	gemini, ok := tokens.Default().Lookup("gemini-2.5-flash")
	if !ok {
		t.Fatal("no gemini-2.5-flash profile")
	}
	for _, prof := range []tokens.Profile{sonnet(t), gpt4o(t), gemini} {
		w := smallTrace(t, 6, 4, 3)
		f, err := HindsightFrontier(w, prof)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Points) < 2 {
			t.Fatalf("%s: a frontier of %d points", prof.Name, len(f.Points))
		}
		format, _ := Format(prof)
		for _, fp := range f.Points {
			r := &runner{cfg: Config{Workload: w, Model: prof.Name, Profile: prof, CompactAt: 1}, format: format, policy: "schedule",
				peer: Peer{Name: "schedule", Schedule: fp.Schedule, Breakpoints: lastBreakpoint}, counts: &Counts{}, removed: map[string]int{}, refused: map[string]int{}}
			got, err := r.run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got.Failed != 0 || math.Abs(got.Dollars-fp.Dollars) > 1e-9+0.001*fp.Dollars || math.Abs(got.ImagesMean-fp.Images) > 1e-9 {
				t.Errorf("%s: the schedule of the point (%.2f images, $%.4f) bills $%.4f for %.2f images (%d failed)",
					prof.Name, fp.Images, fp.Dollars, got.Dollars, got.ImagesMean, got.Failed)
			}
		}
	}
}

// A byte replay carries the client's own compaction and breakpoints: the
// rows that differ from the client or from imgctx's row only in those are
// not replayed, the dial in front of another agent included; the rest are.
func TestReplayedRows(t *testing.T) {
	peers := Peers(3, 10, 5)
	for _, front := range []string{"imgctx", "imgctx@opencode"} {
		i := slices.IndexFunc(peers, func(p Peer) bool { return p.Name == front })
		peers = append(peers, SightPeers(peers[i], []float64{2})...)
	}
	var not []string
	for _, p := range peers {
		if !p.replays() {
			not = append(not, p.Name)
		}
	}
	want := []string{"ref-loop-cached", "strip-on-compact", "opencode", "imgctx@opencode", NaiveImgctx, "imgctx@opencode-sight-2"}
	if !slices.Equal(not, want) {
		t.Errorf("not replayed %v, want %v", not, want)
	}
}
