package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/sim"
)

// `imgctx simulate` with no arguments: computer-use on the Anthropic-like
// profile, every policy, the serve defaults' engine. What issue "Proof of
// value" asks of the imgctx row there, checked on the report itself.
func TestSimulateDefaultScenario(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("two full simulations, sequential: nothing for the race detector, ten times slower under it")
	}
	r := imgctx(t, "simulate")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range append([]string{"cost (USD)", "prefix breaks", "steady-state cache-hit rate"}, sim.Policies...) {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("the table lacks %q:\n%s", want, r.stdout)
		}
	}

	svg, page := filepath.Join(t.TempDir(), "cost.svg"), filepath.Join(t.TempDir(), "report.html")
	r = imgctx(t, "simulate", "--json", "--svg", svg, "--html", page)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var rep struct {
		Workload, Model string
		Policies        []struct {
			Policy       string
			Failed       int
			Dollars      float64
			PrefixBreaks int      `json:"prefix_breaks"`
			Share        float64  `json:"image_removal_write_share"`
			Hit          float64  `json:"steady_cache_hit_rate"`
			Images       float64  `json:"images_per_request_mean"`
			Gap          *float64 `json:"frontier_gap"`
		}
		Reading  []string
		Frontier *struct {
			Points []struct{ Dollars float64 }
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for i, p := range rep.Policies {
		rows[p.Policy] = i
	}
	ours, newest := rep.Policies[rows["imgctx"]], rep.Policies[rows["newest-3/1"]]
	if rep.Workload != "computer-use" || rep.Model != "claude-sonnet-4-6" {
		t.Fatalf("default scenario: %s on %s", rep.Workload, rep.Model)
	}
	// What imgctx does on the default workload: no failed request (its
	// own 413 included), image removals at most 10% of its cache writes,
	// at least 95% steady cache hits, within 10% of the hindsight
	// frontier, and no peer that failed nothing shows as many images for
	// no more (1% counts as no more).
	switch {
	case ours.PrefixBreaks >= newest.PrefixBreaks:
		t.Errorf("imgctx: %d prefix breaks, newest-3/1 %d", ours.PrefixBreaks, newest.PrefixBreaks)
	case ours.Images <= newest.Images:
		t.Errorf("imgctx shows %.1f images per request, newest-3/1 %.1f", ours.Images, newest.Images)
	case rep.Frontier == nil || len(rep.Frontier.Points) < 2:
		t.Errorf("no hindsight frontier: %+v", rep.Frontier)
	case ours.Failed != 0 || ours.Share > 0.10 || ours.Hit < 0.95:
		t.Errorf("imgctx: %d failed, %.1f%% of cache writes from removals, %.1f%% steady hits", ours.Failed, 100*ours.Share, 100*ours.Hit)
	case ours.Gap == nil || *ours.Gap > 0.10:
		t.Errorf("imgctx is %v over the hindsight frontier", ours.Gap)
	}
	for _, p := range rep.Policies {
		if !strings.HasPrefix(p.Policy, "imgctx") && p.Failed == 0 && p.Images >= ours.Images && p.Dollars <= ours.Dollars*1.01 {
			t.Errorf("%s shows %.1f images for $%.2f: imgctx's default (%.1f for $%.2f) is dominated", p.Policy, p.Images, p.Dollars, ours.Images, ours.Dollars)
		}
	}
	// The dial (the imgctx-sight-S rows) shows as many images for no
	// more than each of the agents' own loops: below the default chunked
	// newest-n, OSWorld-style and ephemeral, above it ceiling-batch.
	for _, peer := range []string{"chunked-3/10", "osworld-10/20", "ephemeral", "newest-3/1", "ref-loop", "ceiling-batch-5"} {
		p := rep.Policies[rows[peer]]
		beaten := ""
		for _, q := range rep.Policies {
			if strings.HasPrefix(q.Policy, "imgctx") && q.Failed == 0 && q.Images >= p.Images && q.Dollars <= p.Dollars*1.01 {
				beaten = q.Policy
			}
		}
		if beaten == "" {
			t.Errorf("%s shows %.1f images for $%.2f and no position of the dial does as well", peer, p.Images, p.Dollars)
		}
	}
	if ours.Failed > 0 && !strings.Contains(strings.Join(rep.Reading, "\n"), "imgctx: ") {
		t.Errorf("imgctx failed %d requests and the reading does not say so", ours.Failed)
	}
	// Its cost is compared with every policy that failed nothing, in words.
	cheapest := ours
	for _, p := range rep.Policies {
		if p.Failed == 0 && p.Dollars < cheapest.Dollars {
			cheapest = p
		}
	}
	said := strings.Join(rep.Reading, "\n")
	if cheapest.Policy != "imgctx" && !strings.Contains(said, "imgctx is not the cheapest policy with no refused request: "+cheapest.Policy) {
		t.Errorf("%s is cheaper and the reading does not say so:\n%s", cheapest.Policy, said)
	}
	if b, err := os.ReadFile(svg); err != nil || !strings.Contains(string(b), "<polyline") {
		t.Fatalf("--svg wrote %d bytes, %v", len(b), err)
	}
	// The page says what the table says: each policy and its cost, the
	// chart inline.
	b, err := os.ReadFile(page)
	if err != nil || !strings.Contains(string(b), `<table id="policies">`) || !strings.Contains(string(b), "<polyline") {
		t.Fatalf("--html wrote %d bytes, %v", len(b), err)
	}
	for _, p := range rep.Policies {
		if !strings.Contains(string(b), ">"+p.Policy+"<") || !strings.Contains(string(b), fmt.Sprintf(">$%.2f<", p.Dollars)) {
			t.Errorf("the page lacks %s at $%.2f", p.Policy, p.Dollars)
		}
	}
}

func TestSimulateRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--workload", "chess"},
		{"simulate", "--model", "no-such-model-anywhere"},
		{"simulate", "--image-size", "big"},
		{"simulate", "--prices", "input=cheap"},
		{"simulate", "--policies", "naive,magic"},
	} {
		if r := imgctx(t, args...); r.code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
	for _, bad := range []string{"0", "1.5", "x", "0.2:0", "0.2:soon", "NaN"} {
		if r := imgctx(t, "simulate", "--recall", bad); r.code != 2 || !strings.Contains(r.stderr, "--recall") {
			t.Errorf("--recall %s: exit %d, %q", bad, r.code, r.stderr)
		}
	}
	for _, bad := range []string{"ephemeral", "naive", "imgctx-sight-1", "opencode"} {
		if r := imgctx(t, "simulate", "--sights-front", bad); r.code != 2 || !strings.Contains(r.stderr, "--sights-front") || !strings.Contains(r.stderr, "imgctx@opencode") {
			t.Errorf("--sights-front %s: exit %d, %q", bad, r.code, r.stderr)
		}
	}
	for _, bad := range []string{"0", "2", "-0.5", "NaN"} {
		if r := imgctx(t, "simulate", "--compact-at", bad); r.code != 2 || !strings.Contains(r.stderr, "--compact-at") {
			t.Errorf("--compact-at %s: exit %d, %q", bad, r.code, r.stderr)
		}
	}
}
