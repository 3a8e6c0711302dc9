package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/sim"
)

var matrix = flag.String("matrix", "", "run `imgctx simulate` on every built-in workload × model with the dial's positions and check issue \"price-aware eviction\"'s goals; "+
	"the value is a folder for the reports (about 50 minutes on 2 cores: go test ./cmd/imgctx -run Matrix -matrix /tmp/m -timeout 3h -v)")

var (
	matrixOnly      = flag.String("matrix-models", "", "with -matrix: only these models, comma-separated (the lists of losses are then checked for them alone)")
	matrixWorkloads = flag.String("matrix-workloads", "", "with -matrix: only these workloads, comma-separated (likewise)")
)

// matrixModels and matrixSights: the providers of every cache kind
// (explicit breakpoints at two prices, automatic prefixes with and without
// a steep read discount) and the positions of the dial the goals are
// checked against: denser where the images a request move fastest with
// the dial (below 1 they grow about as 1 / (1 − sight); a peer between two
// positions is matched by one in between).
var (
	matrixModels = []string{"claude-sonnet-4-6", "claude-haiku-4-5", "gpt-4o", "gemini-2.5-flash"}
	matrixSights = "0,0.5,0.6,0.65,0.7,0.75,0.8,0.85,0.87,0.9,0.92,0.95,0.98,1.05,1.1,1.15,1.2,1.3,1.4,1.5,1.6,1.75,2,3,5,10,30,100,1000,100000"
)

// The lists below are what the whole matrix found with the agent
// compacting when refused, as claude-code 2.1.332 does (simulate's
// default), and proxy.client_window on (its default; the code of 831fa60, 55 minutes
// on 2 cores: BENCHMARKS.md "The matrix at the refusal judge").
//
// knownLosses are the peers no imgctx row matches — shows as many images
// for no more, 1% counting as no more — each with why: no position of the
// dial, nor, for a peer whose agent compacts its own way (never, or
// opencode's), imgctx or the dial in front of that agent (sim.NaiveImgctx,
// imgctx@opencode). The
// matrix fails on a loss not listed here and on a listed one that no
// longer happens, so the list says what is true (BENCHMARKS.md "Policies").
var knownLosses = map[string]string{
	// It removes the user's pasted diagrams, one a request; imgctx never
	// removes the human's own images by price (only under window
	// pressure), so its cheapest position still shows all six. Priced
	// like screenshots they leave in the first turns below a sight of 1
	// and never above it (BENCHMARKS.md, the Gemini bullet).
	"doc-review/gemini-2.5-flash/newest-3/1": ownImages,
	// Likewise on Claude at the refusal judge ($4.04 for 3.0 on Sonnet
	// against the default's $4.20 for 6.0, every position the same).
	"doc-review/claude-sonnet-4-6/newest-3/1": ownImages,
	"doc-review/claude-haiku-4-5/newest-3/1":  ownImages,
	// keep-turn-images off: coding's few screenshots gone at each turn's
	// start. The dial's positions below 1 all show what the default does
	// there (its removals at cold starts), a hair over the 1% allowed:
	// Sonnet $12.76 for 2.0 against $12.63 for 1.2 (1.05%), Haiku $4.26
	// against $4.22, gpt-4o at seed 3 the dial at 0 $17.35 for 1.4
	// against $17.18 for 0.8 (1.04%).
	"coding@2/claude-sonnet-4-6/ephemeral": hair,
	"coding@2/claude-haiku-4-5/ephemeral":  hair,
	"coding@3/gpt-4o/ephemeral":            hair,
	// On gpt-4o these loops leave nothing where they drop a screenshot;
	// imgctx leaves a marker, four tokens read on every later request
	// (DESIGN.md principle 5). With markers priced at nothing (a debug
	// build, not committed) the dial matches each: computer-use's chunked
	// by 1.16562 (7.7 for $9.47, 0.5% over its $9.42 for 7.5),
	// computer-use-steady's (7.5 for $9.38 against $9.35), browser's
	// reference loop by 0.5 (4.3 for $10.59 against $10.54 for 3.9) and its
	// chunked by 0.935 (7.5 for $11.88 against $11.90 for 7.4); measured
	// before a batch's remainder stayed in the ledger (Priced.carries).
	"computer-use/gpt-4o/chunked-3/10":        markers, // 1.16406: 7.5 for $9.52, 1.0% more
	"computer-use-steady/gpt-4o/chunked-3/10": markers, // 1.1625: 7.5 for $9.46, 1.2% more
	"browser/gpt-4o/ref-loop":                 markers, // 0.5: 4.3 for 2.2% more than its $10.54 for 3.9, in front of the naive agent too ($10.77)
	"browser/gpt-4o/chunked-3/10":             markers, // 0.934063: 7.5 for 1.3% more than its $11.90 for 7.4
	// OSWorld's sawtooth falls between two positions of the dial, markers
	// or not: halving the dial between them (refine) finds none between.
	// A batch's remainder left in the ledger (Priced.carries) made the dial
	// finer, and matched it on computer-use (2.1875: 19.3 for $13.88, 0.9%
	// over its $13.75 for 18.8), not here (BENCHMARKS.md "The dial's steps, closed in part").
	// Swept 0.005 apart, 2.09 matches it (its 18.810 images for 0.03% less)
	// where 2.0875 and 2.0925 do not: one schedule landing on the peer's,
	// not a setting (BENCHMARKS.md "The six gpt-4o losses, swept at 0.005").
	"computer-use-steady/gpt-4o/osworld-10/20": steps, // 2.14062: 18.7 for $13.62 (its $13.66, 18.8); 2.15625: 19.3 for 1.2% more
	"browser/gpt-4o/osworld-10/20":             steps, // 2.07812: 18.6 for $16.97 (its $17.08, 18.8); 2.09375: 19.8 for 3.0% more
}

// defaultLosses are the peers that dominate imgctx's default — in front of
// the claude-code-like agent or of the peer's own — showing as many images
// or more for no more, 1% counting as no more, each with why.
var defaultLosses = map[string]string{
	// In front of opencode the default removes 7 screenshots by price at
	// cold starts below half the cut, taking the conversation to end
	// before it; this one runs past it, the removals put opencode's
	// compaction 5 requests later, after a cold start that writes the
	// whole prompt again, and the reads saved are paid back (Sonnet: $11.66
	// for 1.8 against opencode's $11.58 for 3.8; 0.7%). In front of the
	// claude-code-like agent the default costs what opencode costs for
	// fewer images ($11.57 for 2.0): its agent's compaction, with the
	// images, costs more than opencode's text transcript. The dial at 5 in
	// front of opencode matches it (BENCHMARKS.md, the opencode bullets).
	"coding@2/claude-sonnet-4-6/opencode": postpones,
	"coding@2/claude-haiku-4-5/opencode":  postpones,
	// Otherwise none. On coding the agents' own loops held the session's few
	// screenshots for under 1% more (Claude: 3.8 a request for $12.05
	// against the default's 1.6 for $11.97; gpt-4o: 3.1 for $16.49 against
	// 2.0 for $16.33) until removals stood down past half the cut, where a
	// removal only postpones the client's compaction (policy.Turn.Postpones,
	// policy.Priced.Postpones). On gpt-4o they still did at seeds 2 and 3
	// (3.0 for $16.34 against 2.6 for $16.25; 2.8 for $16.33 against 2.7
	// for $16.30), through the budget's cold-start batches, which ran from
	// the low-water mark and saved under 1% for a few tenths of an image;
	// they now run only where they save a warm break (policy.ColdBatchPays)
	// and the default shows what the loops show, for what they cost. With
	// the agent compacting elsewhere (--compact-at, not this matrix's
	// workloads) chunked still dominates at some thresholds: Sonnet at 85%
	// and 100% of the window, gpt-4o at 100%, where imgctx's window relief
	// postpones the agent's compaction (BENCHMARKS.md, the coding bullets).
}

const (
	ownImages = "removes the user's own images"
	hair      = "the dial's cheapest end a hair over the 1% allowed"
	steps     = "gpt-4o's line, between two steps of the dial"
	markers   = "the markers it leaves, which the loop does not"
	postpones = "removals at cold starts that only postpone the client's compaction, on a conversation that runs past it"
)

// Every built-in workload × model through `imgctx simulate`: imgctx's
// default is dominated by no peer that failed nothing, every such peer is
// matched by some position of the dial (but the known losses of each), the
// default is within 10% of the hindsight frontier where there is one, and
// on Claude it fails nothing, draws at most 10% of its cache writes from
// removals and reads at least 95% of its steady prompts from the cache.
func TestMatrixOfWorkloadsAndModels(t *testing.T) {
	if *matrix == "" {
		t.Skip("the workload × model matrix runs with -matrix DIR (about 50 minutes on 2 cores)")
	}
	if err := os.MkdirAll(*matrix, 0o755); err != nil {
		t.Fatal(err)
	}
	models, workloads := matrixModels, sim.Workloads
	if *matrixOnly != "" {
		models = strings.Split(*matrixOnly, ",")
	}
	if *matrixWorkloads != "" {
		workloads = strings.Split(*matrixWorkloads, ",")
	}
	ran := func(key string) bool { // a key is workload[@seed]/model/policy
		parts := strings.Split(key, "/")
		w, _, _ := strings.Cut(parts[0], "@")
		return len(parts) > 1 && slices.Contains(workloads, w) && slices.Contains(models, parts[1])
	}
	var cells []cell
	for _, w := range workloads {
		for _, seed := range matrixSeeds(w) {
			for _, m := range models {
				cells = append(cells, cell{workload: w, seed: seed, model: m})
			}
		}
	}
	// The cells run side by side, as many as -test.parallel (GOMAXPROCS):
	// refine's positions run one at a time each, on one core.
	table := make([]string, len(cells))
	seen := map[string]bool{}
	var mu sync.Mutex
	t.Run("cells", func(t *testing.T) {
		for i, c := range cells {
			t.Run(c.String(), func(t *testing.T) {
				t.Parallel()
				rep := matrixReport(t, c)
				mu.Lock()
				defer mu.Unlock()
				table[i] = judge(t, c, rep, seen)
			})
		}
	})
	for key := range knownLosses {
		if ran(key) && !seen[key] {
			t.Errorf("%s is listed as a known loss and no longer happens: take it off the list", key)
		}
	}
	for key := range defaultLosses {
		if ran(key) && !seen["default:"+key] {
			t.Errorf("%s is listed as dominating the default and no longer does: take it off the list", key)
		}
	}
	t.Logf("\n| workload | model | imgctx default | over frontier | removal writes | steady hits | peers no dial position matches |\n|---|---|---|---|---|---|---|\n%s", strings.Join(table, "\n"))
}

// matrixReport is the cell's report, refined: read from the matrix's
// folder where an earlier run left it, else simulated and saved there.
func matrixReport(t *testing.T, c cell) *sim.Report {
	t.Helper()
	path := filepath.Join(*matrix, c.file())
	out, err := os.ReadFile(path)
	if err != nil {
		r := imgctx(t, c.args("--sights", matrixSights, "--json")...)
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s", c, r.code, r.stderr)
		}
		out = []byte(r.stdout)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var rep sim.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	refine(t, c, &rep, path)
	return &rep
}

// matrixSeeds are the seeds a workload is judged at. Coding draws its
// turns' gaps, and so its cold starts, from the seed, and its figures move
// by up to 28% with it; the rest move by at most 1.3% (BENCHMARKS.md,
// "Other seeds"). Seed 1 alone let the default pass there by luck, so
// coding is judged at three.
func matrixSeeds(workload string) []uint64 {
	if workload == "coding" {
		return []uint64{1, 2, 3}
	}
	return []uint64{1}
}

// cell is one report of the matrix.
type cell struct {
	workload string
	seed     uint64
	model    string
}

// String names the cell in the lists of losses: workload/model, the
// workload as workload@seed past seed 1.
func (c cell) String() string {
	if c.seed == 1 {
		return c.workload + "/" + c.model
	}
	return fmt.Sprintf("%s@%d/%s", c.workload, c.seed, c.model)
}

func (c cell) file() string {
	if c.seed == 1 {
		return c.model + "." + c.workload + ".json"
	}
	return fmt.Sprintf("%s.%s@%d.json", c.model, c.workload, c.seed)
}

// args are the arguments of `imgctx simulate` for the cell, then more.
func (c cell) args(more ...string) []string {
	return append([]string{"simulate", "--workload", c.workload, "--seed", strconv.FormatUint(c.seed, 10), "--model", c.model}, more...)
}

// refineSteps is how many times refine halves the dial between two
// positions of the grid.
const refineSteps = 6

// refine looks between the positions of the grid for a peer none of them
// matches: the dial is continuous, the grid is not. Where the images a
// request go from under the peer's at one position to at least its at the
// next, the dial is halved between the two, up to refineSteps times, each
// position run alone. A peer still unmatched whose agent compacts its own
// way (never, or opencode's) is then looked for in front of that agent
// (sim.Report.Losses, judges): the grid run there, then halved likewise.
// The positions run are added to the report, and the report saved with
// them, so a second look reads them and runs no more.
func refine(t *testing.T, c cell, rep *sim.Report, path string) {
	t.Helper()
	grid := strings.Split(matrixSights, ",")
	ran := func(front string, offGrid bool) bool { // positions in front of front's agent, off the grid only
		return slices.ContainsFunc(rep.Policies, func(q sim.PolicyReport) bool {
			f, v, ok := dialOf(q.Policy)
			return ok && f == front && (!offGrid || !slices.Contains(grid, v))
		})
	}
	refined := ran("imgctx", true) // the report was written refined
	_, unmatched := rep.Losses()
	rows := len(rep.Policies)
	for _, peer := range unmatched {
		if !refined && halve(t, c, rep, peer, "imgctx") || peer.Compacts == "shared" {
			continue
		}
		i := slices.IndexFunc(rep.Policies, func(q sim.PolicyReport) bool {
			return q.Policy != "imgctx" && slices.Contains(sim.Fronts, q.Policy) && q.Compacts == peer.Compacts
		})
		if i < 0 || ran(rep.Policies[i].Policy, false) {
			continue
		}
		front := rep.Policies[i].Policy
		rep.Policies = append(rep.Policies, simulateRows(t, c, matrixSights, front, front+"-sight")...)
		halve(t, c, rep, peer, front)
	}
	if len(rep.Policies) > rows {
		out, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// halve halves the dial in front of front's agent between the two
// positions that bracket the peer, up to refineSteps times, adding the
// rows to the report, and reports whether one matches the peer.
func halve(t *testing.T, c cell, rep *sim.Report, peer sim.PolicyReport, front string) bool {
	t.Helper()
	matches := func(row sim.PolicyReport) bool { return row.Failed == 0 && sim.AtLeastAsGood(row, peer) }
	if slices.ContainsFunc(rep.Policies, func(q sim.PolicyReport) bool { f, _, ok := dialOf(q.Policy); return ok && f == front && matches(q) }) {
		return true
	}
	lo, hi, ok := bracket(rep, peer, front)
	for range refineSteps {
		if !ok {
			break
		}
		mid := strconv.FormatFloat((lo+hi)/2, 'g', 6, 64)
		row := simulateRows(t, c, mid, front, front+"-sight-"+mid)[0]
		rep.Policies = append(rep.Policies, row)
		if matches(row) {
			return true
		}
		if v, _ := strconv.ParseFloat(mid, 64); row.ImagesMean < peer.ImagesMean {
			lo = v
		} else {
			hi = v
		}
	}
	return false
}

// simulateRows runs the cell's workload at those positions of the dial in
// front of front's agent, asking for policies, without the frontier.
func simulateRows(t *testing.T, c cell, sights, front, policies string) []sim.PolicyReport {
	t.Helper()
	r := imgctx(t, c.args("--sights", sights, "--sights-front", front, "--policies", policies, "--no-frontier", "--json")...)
	if r.code != 0 {
		t.Fatalf("%s at %s in front of %s: exit %d: %s", c, sights, front, r.code, r.stderr)
	}
	var one sim.Report
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || len(one.Policies) != len(strings.Split(sights, ",")) {
		t.Fatalf("%s at %s in front of %s: %v, %d rows", c, sights, front, err, len(one.Policies))
	}
	return one.Policies
}

// dialOf reads a position of the dial from its row's name: front-sight-S.
func dialOf(policy string) (front, sight string, ok bool) {
	front, sight, ok = strings.Cut(policy, "-sight-")
	return front, sight, ok && strings.HasPrefix(front, "imgctx")
}

// bracket finds the first two neighbouring positions of the dial in front
// of front's agent run on the report, in the dial's order, where the lower
// shows fewer images a request than the peer and the higher at least as
// many (refine is only asked about a peer no position matches, so the
// higher costs more).
func bracket(rep *sim.Report, peer sim.PolicyReport, front string) (lo, hi float64, ok bool) {
	type position struct {
		sight float64
		row   sim.PolicyReport
	}
	var dial []position
	for _, p := range rep.Policies {
		if f, v, found := dialOf(p.Policy); found && f == front && p.Failed == 0 {
			if s, err := strconv.ParseFloat(v, 64); err == nil {
				dial = append(dial, position{s, p})
			}
		}
	}
	slices.SortFunc(dial, func(a, b position) int { return cmp.Compare(a.sight, b.sight) })
	for i := 1; i < len(dial); i++ {
		if a, b := dial[i-1], dial[i]; a.row.ImagesMean < peer.ImagesMean && b.row.ImagesMean >= peer.ImagesMean {
			return a.sight, b.sight, true
		}
	}
	return 0, 0, false
}

// judge checks one report against the goals and returns its table row.
func judge(t *testing.T, c cell, rep *sim.Report, seen map[string]bool) string {
	t.Helper()
	var ours sim.PolicyReport
	for _, p := range rep.Policies {
		if p.Policy == "imgctx" {
			ours = p
		}
	}
	name := c.String()
	over, unmatched := rep.Losses()
	for _, p := range over {
		key := name + "/" + p.Policy
		seen["default:"+key] = true
		if _, known := defaultLosses[key]; !known {
			var defaults []string // the defaults it dominates: in front of claude-code, or of its own agent
			for _, q := range rep.Policies {
				if slices.Contains(sim.Fronts, q.Policy) && (q.Policy == "imgctx" || q.Compacts == p.Compacts) && sim.Dominates(p, q) {
					defaults = append(defaults, fmt.Sprintf("%s ($%.2f, %.1f)", q.Policy, q.Dollars, q.ImagesMean))
				}
			}
			t.Errorf("%s: %s ($%.2f, %.1f images a request) dominates imgctx's default: %s", name, p.Policy, p.Dollars, p.ImagesMean, strings.Join(defaults, ", "))
		}
	}
	var lost []string
	for _, p := range unmatched {
		key := name + "/" + p.Policy
		seen[key] = true
		lost = append(lost, fmt.Sprintf("%s ($%.2f, %.1f)", p.Policy, p.Dollars, p.ImagesMean))
		if _, known := knownLosses[key]; !known {
			t.Errorf("%s: no position of the dial shows %.1f images a request for $%.2f or less, as %s does", name, p.ImagesMean, p.Dollars*1.01, p.Policy)
		}
	}
	gap := "—"
	if ours.FrontierGap != nil {
		gap = fmt.Sprintf("%+.0f%%", 100**ours.FrontierGap)
		if *ours.FrontierGap > 0.10 {
			t.Errorf("%s: imgctx's default is %s over the hindsight frontier", name, gap)
		}
	}
	if strings.HasPrefix(rep.Model, "claude") {
		if ours.Failed > 0 {
			t.Errorf("%s: imgctx's default failed %d requests", name, ours.Failed)
		}
		if ours.ImageWriteShare > 0.10 && !slices.Contains(writeShareOver, name) {
			t.Errorf("%s: %.1f%% of imgctx's cache writes come from removals", name, 100*ours.ImageWriteShare)
		}
		if ours.SteadyHitRate < 0.95 {
			t.Errorf("%s: imgctx's steady cache hits %.1f%%", name, 100*ours.SteadyHitRate)
		}
	}
	share := "—"
	if ours.ImageWriteShare == ours.ImageWriteShare { // not NaN
		share = fmt.Sprintf("%.1f%%", 100*ours.ImageWriteShare)
	}
	workload, _, _ := strings.Cut(name, "/")
	return fmt.Sprintf("| %s | `%s` | $%.2f, %.1f images | %s | %s | %.1f%% | %s |", workload, rep.Model, ours.Dollars, ours.ImagesMean, gap, share, 100*ours.SteadyHitRate, strings.Join(lost, ", "))
}

// writeShareOver are the Claude workloads where imgctx's default draws more
// than 10% of its cache writes from removals, with why in BENCHMARKS.md:
// none since a batch at the image limit keeps no image at the default.
var writeShareOver = []string{}

// The dial's two neighbouring positions between which the images a
// request cross a peer's, in the dial's order whatever order the rows come
// in, in front of the agent asked for only, and none when every position
// shows fewer.
func TestBracketFindsWhereTheDialCrossesAPeer(t *testing.T) {
	row := func(name string, images, dollars float64) sim.PolicyReport {
		return sim.PolicyReport{Policy: name, ImagesMean: images, Dollars: dollars}
	}
	rep := &sim.Report{Policies: []sim.PolicyReport{
		row("chunked-3/10", 7.5, 9.42), row("imgctx", 13.8, 11.8),
		row("imgctx-sight-1.15", 8.9, 10.19), row("imgctx-sight-0", 3.0, 7.9), row("imgctx-sight-1.1", 7.0, 9.42),
		row("imgctx@opencode-sight-1.12", 7.6, 9.5), row("imgctx@opencode-sight-0.5", 4.0, 8.1),
	}}
	lo, hi, ok := bracket(rep, rep.Policies[0], "imgctx")
	if !ok || lo != 1.1 || hi != 1.15 {
		t.Fatalf("bracket %v..%v (%v): want 1.1..1.15", lo, hi, ok)
	}
	lo, hi, ok = bracket(rep, rep.Policies[0], "imgctx@opencode")
	if !ok || lo != 0.5 || hi != 1.12 {
		t.Fatalf("bracket in front of opencode %v..%v (%v): want 0.5..1.12", lo, hi, ok)
	}
	if _, _, ok := bracket(rep, row("naive", 50, 9), "imgctx"); ok {
		t.Fatal("bracketed a peer no position reaches")
	}
}
