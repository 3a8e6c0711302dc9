package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
)

func sonnet(t *testing.T) tokens.Profile {
	p, ok := tokens.Default().Lookup("claude-sonnet-4-6")
	if !ok || p.Prices == nil {
		t.Fatal("claude-sonnet-4-6 has no profile with prices")
	}
	return p
}

func small() Params {
	p := DefaultParams("computer-use")
	p.Turns, p.ImagesPerTurn, p.IdleEvery = 8, 5, 4
	return p
}

func run(t *testing.T, w *Workload, prof tokens.Profile, e engine.Config, policies ...string) *Report {
	t.Helper()
	rep, err := Run(context.Background(), Config{Workload: w, Model: "claude-sonnet-4-6", Profile: prof, Engine: e, Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func row(r *Report, policy string) PolicyReport {
	for _, p := range r.Policies {
		if p.Policy == policy {
			return p
		}
	}
	return PolicyReport{}
}

// The imgctx row runs the gateway's engine: changing an engine setting
// changes what it sends, and so the report.
func TestAnEngineSettingChangesTheImgctxRow(t *testing.T) {
	w, err := Build("computer-use", small())
	if err != nil {
		t.Fatal(err)
	}
	held := row(run(t, w, sonnet(t), engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}}, "imgctx"), "imgctx")
	perTurn := row(run(t, w, sonnet(t), engine.Config{Keep: policy.KeepConfig{Hold: false}}, "imgctx"), "imgctx")
	if held.PrefixBreaks >= perTurn.PrefixBreaks || held.Removed["priced"] == 0 || perTurn.Removed["priced"] != 0 {
		t.Fatalf("keep.hold on: %d breaks, removed %v; off: %d breaks, removed %v — want fewer breaks, removals by price only when held",
			held.PrefixBreaks, held.Removed, perTurn.PrefixBreaks, perTurn.Removed)
	}
	tight := row(run(t, w, sonnet(t), engine.Config{Keep: policy.KeepConfig{BudgetFraction: 0.01}}, "imgctx"), "imgctx")
	if tight.ImagesMean >= perTurn.ImagesMean || tight.Removed["budget"] <= perTurn.Removed["budget"] {
		t.Fatalf("a 1%% budget shows %.1f images (%d removed); the 10%% default %.1f (%d)", tight.ImagesMean, tight.Removed["budget"], perTurn.ImagesMean, perTurn.Removed["budget"])
	}
}

// A run leaves nothing running behind it: its gateway's request-log
// writer, left going, kept the whole run — store, engine, held request
// bodies — alive, and a matrix of runs in one process passed 20 GB.
func TestARunLeavesNoGoroutineBehind(t *testing.T) {
	w, err := Build("computer-use", small())
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	run(t, w, sonnet(t), engine.Config{}, "imgctx", "naive")
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); after > before && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before the run, %d after:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// The dial: along keep.sight imgctx shows more images for more money, and
// every position below the default removes only by price, in batches.
func TestTheSightDialMovesAlongTheCurve(t *testing.T) {
	p := DefaultParams("computer-use")
	p.Turns, p.IdleEvery = 16, 8 // long enough for a warm batch to pay
	w, err := Build("computer-use", p)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Workload: w, Model: "claude-sonnet-4-6", Profile: sonnet(t), Policies: []string{"imgctx"}, NoFrontier: true,
		Engine: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}}, Sights: []float64{0, 0.9}}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cheap, mid, def := row(rep, "imgctx-sight-0"), row(rep, "imgctx-sight-0.9"), row(rep, "imgctx")
	if !(cheap.ImagesMean < mid.ImagesMean && mid.ImagesMean < def.ImagesMean) || !(cheap.Dollars < mid.Dollars && mid.Dollars < def.Dollars) {
		t.Fatalf("sight 0: %.1f images $%.3f; 0.9: %.1f $%.3f; default 1: %.1f $%.3f — want both rising along the dial",
			cheap.ImagesMean, cheap.Dollars, mid.ImagesMean, mid.Dollars, def.ImagesMean, def.Dollars)
	}
	for _, r := range []PolicyReport{cheap, mid} {
		if r.Failed > 0 || r.Removed["priced"] == 0 || r.ImageBreaks > r.Removed["priced"] {
			t.Fatalf("%s: %d failed, removed %v, %d breaks by images: want removals by price, in batches", r.Policy, r.Failed, r.Removed, r.ImageBreaks)
		}
	}
}

// Invariants of every row: no accepted prompt past the window, every
// attached image either in the last request or counted as removed, and
// the same seed gives the same report. The provider's image limit is
// lowered to 25 so that the policies that never remove are refused.
func TestEveryPolicyKeepsTheInvariants(t *testing.T) {
	w, err := Build("computer-use", small())
	if err != nil {
		t.Fatal(err)
	}
	prof := sonnet(t)
	prof.Limits.MaxImages = 25
	rep := run(t, w, prof, engine.Config{Keep: policy.KeepConfig{Hold: true}})
	again := run(t, w, prof, engine.Config{Keep: policy.KeepConfig{Hold: true}})
	a, _ := json.Marshal(rep)
	b, _ := json.Marshal(again)
	if !bytes.Equal(a, b) {
		t.Fatal("two runs of one workload differ")
	}
	if len(rep.Policies) != len(Policies) {
		t.Fatalf("%d rows; want %d", len(rep.Policies), len(Policies))
	}
	for _, p := range rep.Policies {
		if p.LargestPrompt > prof.ContextWindow {
			t.Errorf("%s: a prompt of %d tokens was accepted in a %d window", p.Policy, p.LargestPrompt, prof.ContextWindow)
		}
		removed := 0
		for _, n := range p.Removed {
			removed += n
		}
		if p.Failed == 0 && removed+p.FinalImages != rep.Occurrences {
			t.Errorf("%s: %d removed + %d in the last request ≠ %d attached", p.Policy, removed, p.FinalImages, rep.Occurrences)
		}
		if len(p.Series) != rep.Steps {
			t.Errorf("%s: %d points for %d steps", p.Policy, len(p.Series), rep.Steps)
		}
	}
	if row(rep, "naive").Removed == nil || len(row(rep, "naive").Removed) != 0 {
		t.Error("naive removed images")
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	lines, points, frontiers, fails := 0, 0, 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		class := ""
		for _, a := range se.Attr {
			if a.Name.Local == "class" {
				class = a.Value
			}
		}
		switch {
		case se.Name.Local == "polyline" && class == "frontier":
			frontiers++
		case se.Name.Local == "polyline":
			lines++
		case se.Name.Local == "circle" && class == "policy":
			points++
		case class == "failed":
			fails++
		}
	}
	failing := 0
	for _, p := range rep.Policies {
		for _, pt := range p.Series {
			if pt.Failed {
				failing++
				break
			}
		}
	}
	if lines != 2*len(Policies) || points != 2*len(Policies) || frontiers != 1 || fails != 2*failing {
		t.Fatalf("the SVG has %d lines, %d points, %d frontiers, %d failure marks; want one line per policy in each of the two step charts, "+
			"one point per policy in each of the two scatters, the frontier, and the failed steps of %d policies marked in both step charts", lines, points, frontiers, fails, failing)
	}
	if failing == 0 {
		t.Fatal("no policy failed a request: the failure marks are not exercised")
	}
	var table strings.Builder
	rep.WriteTable(&table)
	for _, want := range []string{"imgctx", "newest-3/1", "chunked-3/10", "steady-state cache-hit rate", "cost (USD)", "hindsight frontier"} {
		if !strings.Contains(table.String(), want) {
			t.Fatalf("the table lacks %q:\n%s", want, table.String())
		}
	}
}

// A sessions export replays as a workload of its recorded sizes and times.
func TestReplayFromExport(t *testing.T) {
	shot := chat.Image{Ref: blob.Of([]byte("shot")), MediaType: "image/png", Width: 1280, Height: 800, Origin: chat.FromTool}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	snap := session.Snapshot{Meta: session.Meta{ID: "s_1", Tenant: "default", Thread: chat.Main}, Log: []session.Entry{
		{Seq: 1, At: at, Message: &chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "open the page"}}}},
		{Seq: 2, At: at.Add(2 * time.Second), Message: &chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.ToolCall{ID: "c1", Name: "screenshot", Arguments: "{}"}}}},
		{Seq: 3, At: at.Add(9 * time.Second), Message: &chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c1", Parts: []chat.Part{shot}}}}},
		{Seq: 4, At: at.Add(12 * time.Second), Message: &chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: "I see it."}}}},
	}}
	var export bytes.Buffer
	if err := session.ExportJSONL(&export, snap); err != nil {
		t.Fatal(err)
	}
	rec, err := FromFile(&export, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Steps) != 2 || rec.Steps[1].Think != 10*time.Second || len(rec.Images) != 1 || rec.Images[0].W != 1280 {
		t.Fatalf("export replayed as %d steps (think %v), %d images", len(rec.Steps), rec.Steps[len(rec.Steps)-1].Think, len(rec.Images))
	}
	if _, err := FromFile(strings.NewReader(`{"hello":1}`), 0); err == nil {
		t.Fatal("a file of neither kind was accepted")
	}
}

// A recorded file is data: whatever it holds, FromFile answers a workload
// or an error, never a panic, and never draws an image past the bound.
func FuzzFromFile(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"}}]}]}`))
	f.Add([]byte(`{"type":"session","version":1,"id":"s_1","tenant":"default"}` + "\n" + `{"type":"state","state":{"version":1}}`))
	f.Add([]byte(`{"messages":[{"role":"tool","content":null},{"role":"assistant","tool_calls":[{"id":"c"}]}]}`))
	// A session export with a turn, a tool call and a screenshot, for the
	// fuzzer to start its exports from.
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	shot := chat.Image{Ref: blob.Of([]byte("shot")), MediaType: "image/png", Width: 1280, Height: 800, Bytes: 90_000}
	msgs := []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "look"}}},
		{Role: chat.Assistant, Parts: []chat.Part{chat.ToolCall{ID: "c1", Name: "screenshot", Arguments: "{}"}}},
		{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c1", Name: "screenshot", Parts: []chat.Part{shot}}}}}
	snap := session.Snapshot{Meta: session.Meta{ID: "s_1", Tenant: "default", Settings: chat.Settings{Model: "gpt-4o"}, Created: at, Updated: at},
		State: session.State{Live: msgs, LastActivity: at}}
	for i := range msgs {
		snap.Log = append(snap.Log, session.Entry{Seq: int64(i + 1), At: at.Add(time.Duration(i) * time.Second), Message: &msgs[i]})
	}
	var export bytes.Buffer
	if err := session.ExportJSONL(&export, snap); err != nil {
		f.Fatal(err)
	}
	f.Add(export.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := FromFile(bytes.NewReader(data), time.Second)
		if err == nil && w == nil {
			t.Fatal("no workload and no error")
		}
	})
}

// Axis ticks are round: steps of 1, 2, 2.5 or 5 times a power of ten,
// from 0 to the first tick at or past the maximum.
func TestNiceTicks(t *testing.T) {
	for _, c := range []struct {
		max  float64
		n    int
		want []float64
	}{
		{7.84, 4, []float64{0, 2, 4, 6, 8}},
		{15.4, 4, []float64{0, 5, 10, 15, 20}},
		{46.9, 5, []float64{0, 10, 20, 30, 40, 50}},
		{1, 5, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
		{0, 4, []float64{0, 0.25, 0.5, 0.75, 1}},
	} {
		got := niceTicks(c.max, c.n)
		if len(got) != len(c.want) {
			t.Fatalf("niceTicks(%g, %d) = %v; want %v", c.max, c.n, got, c.want)
		}
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-9 {
				t.Fatalf("niceTicks(%g, %d) = %v; want %v", c.max, c.n, got, c.want)
			}
		}
	}
}

// The recency measure names images as the provider received them on every
// wire: naive, which removes nothing, shows the last 10 screenshots on
// each (the OpenAI data URLs once hid them: 0%); a workload without
// screenshots has no recency.
func TestRecencyOnEveryWire(t *testing.T) {
	w, err := Build("computer-use", small())
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"claude-sonnet-4-6", "gpt-4o", "gemini-2.5-flash"} {
		prof, _ := tokens.Default().Lookup(model)
		rep, err := Run(context.Background(), Config{Workload: w, Model: model, Profile: prof, Policies: []string{"naive"}, NoFrontier: true})
		if err != nil {
			t.Fatal(err)
		}
		if r := row(rep, "naive"); r.Failed == 0 && r.Recency != 1 {
			t.Errorf("%s: naive shows %.0f%% of the last 10 screenshots", model, 100*r.Recency)
		}
	}
	p := DefaultParams("doc-review")
	p.Turns, p.ImageKB = 4, 0
	docs, err := Build("doc-review", p)
	if err != nil {
		t.Fatal(err)
	}
	if r := row(run(t, docs, sonnet(t), engine.Config{}, "naive"), "naive"); !math.IsNaN(r.Recency) {
		t.Errorf("doc-review has no screenshot; its recency is %v", r.Recency)
	}
}

// The reading says where imgctx loses: a peer that shows as many images
// for no more than the default (1% counting as no more) and does better in
// one of the two, and each peer no imgctx row matches; a peer that failed
// requests is not a standard, one alike the default does not dominate it.
func TestReadingSaysWhereImgctxLoses(t *testing.T) {
	row := func(name string, dollars, images float64, failed int) PolicyReport {
		return PolicyReport{Policy: name, Dollars: dollars, ImagesMean: images, Failed: failed, Requests: 10}
	}
	rep := &Report{Policies: []PolicyReport{
		row("naive", 1, 90, 3),                // failed: no standard
		row("chunked-3/10", 4.94, 7.5, 0),     // matched by the dial
		row("ceiling-batch-5", 8.83, 46.9, 0), // matched by none
		row("big", 7.35, 40.6, 0),             // more images than the default for 0.4% more
		row("alike", 7.33, 40.1, 0),           // the default's images for 0.1% more: no better
		row("imgctx", 7.32, 40.1, 0),
		row("imgctx-sight-0", 4.56, 10.3, 0),
	}}
	said := strings.Join(rep.Reading(), "\n")
	for _, want := range []string{
		"imgctx's default is dominated: big ($7.35, 40.6 images per request) shows as many images for no more.",
		"No imgctx row run here shows as many images for no more than ceiling-batch-5 ($8.83, 46.9 images per request), big ($7.35, 40.6 images per request).",
	} {
		if !strings.Contains(said, want) {
			t.Errorf("reading lacks %q:\n%s", want, said)
		}
	}
	if strings.Contains(said, "than chunked") || strings.Contains(said, "than naive") || strings.Contains(said, "naive ($") || strings.Contains(said, "alike ($") {
		t.Errorf("reading names a peer imgctx matches, or one that failed:\n%s", said)
	}
}

// The recall model: each imgctx row runs again with markers naming
// handles and the model asking for removed images back, one request a
// recalled image, whose tool result carries the image after its marker;
// the row without recall is the same run as without the model.
func TestTheRecallModelAsksForRemovedImagesBack(t *testing.T) {
	p := DefaultParams("computer-use")
	p.Turns, p.IdleEvery = 16, 8
	w, err := Build("computer-use", p)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bodies [][]byte
	cfg := Config{Workload: w, Model: "claude-sonnet-4-6", Profile: sonnet(t), Policies: []string{"imgctx-sight-0"}, NoFrontier: true,
		Engine: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}}, Sights: []float64{0}, Recall: Recall{Share: 0.5, After: 3},
		Received: func(policy string, b []byte) {
			if policy == "imgctx-sight-0+recall" {
				mu.Lock()
				bodies = append(bodies, b)
				mu.Unlock()
			}
		}}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, rec := row(rep, "imgctx-sight-0"), row(rep, "imgctx-sight-0+recall")
	if rec.Recalled == 0 || rec.Requests != base.Requests+rec.Recalled || rec.Dollars <= base.Dollars || base.Recalled != 0 {
		t.Fatalf("with recall: %d recalled in %d requests ($%.3f); without: %d requests ($%.3f)", rec.Recalled, rec.Requests, rec.Dollars, base.Requests, base.Dollars)
	}
	marked, back := false, false
	for _, b := range bodies {
		marked = marked || bytes.Contains(b, []byte(`— recall with imgctx_recall(\"i`))
		back = back || bytes.Contains(b, []byte(`"name":"imgctx_recall"`)) && bytes.Contains(b, []byte(`Image recalled.`))
	}
	if !marked || !back {
		t.Fatalf("markers with handles %v, a recall answered with its image %v", marked, back)
	}
	cfg.Recall, cfg.Received = Recall{}, nil
	again, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r := row(again, "imgctx-sight-0"); r.Dollars != base.Dollars || r.Requests != base.Requests || len(again.Policies) != 1 {
		t.Fatalf("the recall model changed the row without it: $%.4f, %d requests (with it: $%.4f, %d)", r.Dollars, r.Requests, base.Dollars, base.Requests)
	}
}

// With file ids, an imgctx row pays and shows exactly what its twin does
// (the same decisions, the same prefix breaks) and sends each image once:
// its uploads carry about the unique image bytes, its requests a fraction of
// the twin's bytes. On the built-in workloads' wires with a Files API
// (their OpenAI rows speak Chat Completions, which has none: unchanged).
func TestFileIDsSendEachImageOnce(t *testing.T) {
	w, err := Build("computer-use", small())
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"claude-sonnet-4-6", "gemini-2.5-flash"} {
		prof, _ := tokens.Default().Lookup(model)
		rep, err := Run(context.Background(), Config{Workload: w, Model: model, Profile: prof, Policies: []string{"imgctx"}, NoFrontier: true, FileIDs: true})
		if err != nil {
			t.Fatal(err)
		}
		base, files := row(rep, "imgctx"), row(rep, "imgctx+files")
		if base.Requests == 0 || files.Requests != base.Requests {
			t.Fatalf("%s: rows %+v", model, rep.Policies)
		}
		if files.Failed != 0 || files.Dollars != base.Dollars || files.ImagesMean != base.ImagesMean || files.PrefixBreaks != base.PrefixBreaks {
			t.Errorf("%s: +files %d failed, $%.4f %.1f images %d breaks; without $%.4f %.1f %d", model, files.Failed, files.Dollars, files.ImagesMean, files.PrefixBreaks,
				base.Dollars, base.ImagesMean, base.PrefixBreaks)
		}
		if files.BytesUploaded < files.UniqueBytes || files.BytesUploaded > files.UniqueBytes*3/2+100_000 {
			t.Errorf("%s: uploaded %d bytes for %d unique image bytes", model, files.BytesUploaded, files.UniqueBytes)
		}
		if files.BytesSent*5 > base.BytesSent || base.BytesUploaded != 0 {
			t.Errorf("%s: +files sent %d bytes, without %d (uploads %d)", model, files.BytesSent, base.BytesSent, base.BytesUploaded)
		}
	}
}

// A coding agent that compacts its own history: a screenshot taken out
// late in a cycle only postpones the compaction, and the requests it adds
// read nearly the whole window (policy.Turn.Postpones, Priced.Postpones).
// With removals standing down past half the cut, chunked newest-n does
// not dominate imgctx's default where the agent compacts at 80% to 90% of
// the window on gpt-4o (the budget decides there: applied throughout it
// cost more at 85%, $15.89 against $15.66, for fewer images; now it shows
// and costs what chunked does), and at 80% and 90% on Sonnet (price
// decides: removing at every cold start cost $11.70 against $11.22 at
// 80%).
func TestARemovalDoesNotPostponeTheAgentsCompaction(t *testing.T) {
	w, err := Build("coding", DefaultParams("coding"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model string
		at    []float64
	}{
		{"gpt-4o", []float64{0.8, 0.85, 0.9}},
		{"claude-sonnet-4-6", []float64{0.8, 0.9}},
	} {
		prof, ok := tokens.Default().Lookup(c.model)
		if !ok {
			t.Fatalf("no %s profile", c.model)
		}
		for _, at := range c.at {
			rep, err := Run(context.Background(), Config{Workload: w, Model: c.model, Profile: prof, Policies: []string{"imgctx", "chunked-3/10"}, NoFrontier: true, CompactAt: at,
				Engine: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}}})
			if err != nil {
				t.Fatal(err)
			}
			ours, peer := row(rep, "imgctx"), row(rep, "chunked-3/10")
			if ours.Compactions == 0 || Dominates(peer, ours) {
				t.Errorf("%s compacting at %.2f: imgctx $%.2f for %.1f images (%d compactions), chunked $%.2f for %.1f", c.model, at, ours.Dollars, ours.ImagesMean, ours.Compactions, peer.Dollars, peer.ImagesMean)
			}
		}
	}
}

// A client that compacts its own history later than the proxy's window
// relief was postponed by it: the relief took images out before the
// client's compaction, and the requests it added were the largest of the
// cycle. Where the conversation's text fills over half the window the
// relief leaves the window to the client (textFills), at 95% as at the
// default, the window itself (BENCHMARKS.md, the coding bullets).
func TestTheWindowReliefLeavesATextFilledConversationToItsClient(t *testing.T) {
	w, err := Build("coding", DefaultParams("coding"))
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"gpt-4o", "claude-sonnet-4-6"} {
		prof, ok := tokens.Default().Lookup(model)
		if !ok {
			t.Fatalf("no %s profile", model)
		}
		for _, relief := range []float64{0.95, 0} {
			rep, err := Run(context.Background(), Config{Workload: w, Model: model, Profile: prof, Policies: []string{"imgctx", "chunked-3/10"}, NoFrontier: true, CompactAt: 0.97,
				Engine: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}, ProxyRelief: relief}})
			if err != nil {
				t.Fatal(err)
			}
			ours, peer := row(rep, "imgctx"), row(rep, "chunked-3/10")
			if ours.Failed != 0 || ours.Removed["window"] != 0 || ours.Compactions == 0 || Dominates(peer, ours) {
				t.Errorf("%s, relief %v: %d failed, %d removed by the window, %d compactions, $%.2f for %.1f images against chunked's $%.2f for %.1f",
					model, relief, ours.Failed, ours.Removed["window"], ours.Compactions, ours.Dollars, ours.ImagesMean, peer.Dollars, peer.ImagesMean)
			}
		}
	}
}

// The agents that never compact are judged against imgctx in front of an
// agent that never compacts either: on doc-review the pasted diagrams stay
// to the end for them, and a compacting agent's summary takes them away
// in front of imgctx, which cannot undo it. imgctx@naive shows what they
// show for no more; the claude-code row does not.
func TestAgentsThatNeverCompactAreJudgedInFrontOfTheirLike(t *testing.T) {
	w, err := Build("doc-review", DefaultParams("doc-review"))
	if err != nil {
		t.Fatal(err)
	}
	// The agent compacting at 90%: doc-review reaches that, not the window.
	rep, err := Run(context.Background(), Config{Workload: w, Model: "claude-sonnet-4-6", Profile: sonnet(t), CompactAt: 0.9, Policies: []string{"naive", "imgctx", NaiveImgctx}})
	if err != nil {
		t.Fatal(err)
	}
	naive, ours, front := row(rep, "naive"), row(rep, "imgctx"), row(rep, NaiveImgctx)
	if naive.Compacts != "" || front.Compacts != "" || ours.Compacts != "shared" {
		t.Fatalf("compacts: naive %q, %s %q, imgctx %q", naive.Compacts, NaiveImgctx, front.Compacts, ours.Compacts)
	}
	if ours.Compactions == 0 || front.Compactions != 0 || naive.Compactions != 0 {
		t.Fatalf("compactions: imgctx %d, %s %d, naive %d", ours.Compactions, NaiveImgctx, front.Compactions, naive.Compactions)
	}
	if AtLeastAsGood(ours, naive) {
		t.Fatalf("imgctx in front of claude-code ($%.2f, %.2f) matches naive ($%.2f, %.2f): the workload no longer tells the agents apart", ours.Dollars, ours.ImagesMean, naive.Dollars, naive.ImagesMean)
	}
	if !AtLeastAsGood(front, naive) {
		t.Errorf("%s ($%.2f, %.2f) does not match naive ($%.2f, %.2f)", NaiveImgctx, front.Dollars, front.ImagesMean, naive.Dollars, naive.ImagesMean)
	}
	if _, unmatched := rep.Losses(); len(unmatched) > 0 {
		t.Errorf("unmatched: %+v", unmatched)
	}
	without := &Report{Policies: slices.DeleteFunc(slices.Clone(rep.Policies), func(p PolicyReport) bool { return p.Policy == NaiveImgctx })}
	if _, unmatched := without.Losses(); len(unmatched) != 1 || unmatched[0].Policy != "naive" {
		t.Errorf("without %s, unmatched %+v, want naive", NaiveImgctx, unmatched)
	}
}

// An imgctx row in front of another agent than the claude-code-like one
// judges only the peers whose agents compact as its client does: in front
// of an agent that never compacts it keeps what a compacting agent's
// summary takes away, and in front of opencode it loses what the others
// keep. The claude-code-like rows judge every peer. imgctx's default is
// dominated where a peer beats it in front of the peer's own agent too.
func TestAnImgctxRowInFrontOfAnotherAgentJudgesOnlyItsLike(t *testing.T) {
	row := func(name string, dollars, images float64, compacts string) PolicyReport {
		return PolicyReport{Policy: name, Dollars: dollars, ImagesMean: images, Compacts: compacts, Requests: 10}
	}
	rep := &Report{Policies: []PolicyReport{
		row("naive", 4.20, 6.0, ""),
		row("chunked-3/10", 4.14, 5.9, "shared"),
		row("opencode", 4.30, 6.5, "transcript"),
		row("newest-3/1", 4.00, 3.0, "fresh"),
		row("imgctx", 4.00, 5.7, "shared"),
		row("imgctx-sight-0", 3.90, 3.0, "shared"),
		row(NaiveImgctx, 4.10, 6.0, ""),
		row("imgctx@opencode", 4.35, 6.0, "transcript"),         // its default, which opencode dominates
		row("imgctx@opencode-sight-2", 4.12, 6.5, "transcript"), // would match chunked-3/10 if it judged it
	}}
	over, unmatched := rep.Losses()
	if len(unmatched) != 1 || unmatched[0].Policy != "chunked-3/10" {
		t.Errorf("unmatched %+v, want chunked-3/10 alone", unmatched)
	}
	if len(over) != 1 || over[0].Policy != "opencode" {
		t.Errorf("over %+v, want opencode alone (the default in front of it)", over)
	}
	rep.Policies[2].ImagesMean = 6.6 // opencode now shows more than imgctx in front of it
	if _, unmatched := rep.Losses(); len(unmatched) != 2 || unmatched[1].Policy != "opencode" {
		t.Errorf("unmatched %+v, want chunked-3/10 and opencode", unmatched)
	}
}

// A row asked for by two names runs once: "ref-loop" selects
// ref-loop-cached as well, which --policies naive,ref-loop,ref-loop-cached
// then asked for again.
func TestARowAskedForTwiceRunsOnce(t *testing.T) {
	w, err := Build("doc-review", DefaultParams("doc-review"))
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, w, sonnet(t), engine.Config{}, "ref-loop", "ref-loop-cached", "naive")
	var names []string
	for _, p := range rep.Policies {
		names = append(names, p.Policy)
	}
	if want := []string{"ref-loop", "ref-loop-cached", "naive"}; !slices.Equal(names, want) {
		t.Errorf("rows %v, want %v", names, want)
	}
	if _, err := Run(context.Background(), Config{Workload: w, Model: "claude-sonnet-4-6", Profile: sonnet(t), Policies: []string{"ref-loop", "nonesuch"}}); err == nil || !strings.Contains(err.Error(), `"nonesuch"`) {
		t.Errorf("an unknown name: %v", err)
	}
}
