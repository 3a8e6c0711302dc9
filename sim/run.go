package sim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/gateway"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// Policies lists the image policies at their default parameters, in
// report order.
var Policies = func() []string {
	var out []string
	for _, p := range Peers(3, 10, 5) {
		out = append(out, p.Name)
	}
	return out
}()

// Fronts are the imgctx rows at their defaults in front of an agent, the
// ones the dial's positions may sit in front of (Config.SightsFront).
var Fronts = func() []string {
	var out []string
	for _, p := range Peers(3, 10, 5) {
		if p.fronts() {
			out = append(out, p.Name)
		}
	}
	return out
}()

// matches reports whether a policy asked for by name selects a row: its
// whole name or its name without parameters ("chunked" for "chunked-3/10",
// "imgctx" for "imgctx-sight-0" and "imgctx+recall").
func matches(row, asked string) bool {
	return row == asked || strings.HasPrefix(row, asked+"-") || strings.HasPrefix(row, asked+"+")
}

// Config is one simulation: a workload under several policies against an
// emulated provider of one profile.
type Config struct {
	Workload *Workload
	Model    string         // the model the agent asks for
	Profile  tokens.Profile // the provider's rules and prices
	Policies []string       // default: all
	// N and Chunk are the chunked newest-n row's (default 3 and 10);
	// KeepNewest what ceiling-batch keeps when it evicts (5).
	N, Chunk, KeepNewest int
	// CompactAt is the share of the window past which the agent (every
	// policy but naive and opencode's) compacts its history; at 1 (the
	// default) it compacts only when refused, as claude-code 2.1.332 does
	// (scripts/agentcheck; 2.0.77 compacted at the window less 45,000).
	CompactAt float64
	// Engine configures the imgctx and ephemeral rows' engine (the
	// gateway's defaults: internal/config).
	Engine engine.Config
	// KeepOff turns keep-turn-images off for the imgctx row too, as
	// proxy.keep_turn_images: false does for serve.
	KeepOff bool
	// Sights are keep.sight positions run as imgctx rows of their own
	// (imgctx-sight-S), after the default's.
	Sights []float64
	// SightsFront is the imgctx row whose agent the dial's positions sit
	// in front of (default "imgctx", the claude-code-like one).
	SightsFront string
	// Recall is the recall model: with a share, every imgctx row is run
	// again with it (policy+recall), built-in workloads only.
	Recall Recall
	// Progress, when set, is called after each request.
	Progress func(policy string, step, steps int)
	// NoFrontier skips the hindsight frontier.
	NoFrontier bool
	// Received, when set, sees each body the emulated provider receives,
	// by policy.
	Received func(policy string, body []byte)
	// FileIDs runs every imgctx row again with file ids (policy+files).
	FileIDs bool
}

// Report is a simulation's result.
type Report struct {
	Workload    string         `json:"workload"`
	Model       string         `json:"model"`
	Profile     string         `json:"profile"`
	Format      string         `json:"format"`
	Steps       int            `json:"steps"`
	Window      int            `json:"context_window"`
	Images      int            `json:"distinct_images"`
	Occurrences int            `json:"image_attachments"`
	Prices      tokens.Prices  `json:"prices_per_mtok"`
	ImageBytes  int64          `json:"image_bytes_mean"` // encoded bytes of a distinct image, mean
	Policies    []PolicyReport `json:"policies"`
	Frontier    *Frontier      `json:"frontier,omitempty"`
	Notes       []string       `json:"reading"` // what the numbers say (Reading)
}

// PolicyReport is one policy's row.
type PolicyReport struct {
	Policy          string         `json:"policy"`
	Reproduces      string         `json:"reproduces"`
	Requests        int            `json:"requests"`
	Failed          int            `json:"failed"`
	FailedBy        map[string]int `json:"failed_by,omitempty"`
	Compactions     int            `json:"compactions"`
	Compacts        string         `json:"compacts,omitempty"` // how the agent (the client, for an imgctx row) compacts its history (Peer.Compact); empty: never
	Input           int64          `json:"input_tokens"`
	CacheRead       int64          `json:"cache_read_tokens"`
	CacheWrite      int64          `json:"cache_write_tokens"`
	Output          int64          `json:"output_tokens"`
	Dollars         float64        `json:"dollars"`
	PrefixBreaks    int            `json:"prefix_breaks"`
	ImageBreaks     int            `json:"prefix_breaks_by_images"`
	ImageWriteShare float64        `json:"image_removal_write_share"` // NaN when nothing was written (no write fee: OpenAI)
	SteadyHitRate   float64        `json:"steady_cache_hit_rate"`
	ImagesMean      float64        `json:"images_per_request_mean"`
	ImagesMin       int            `json:"images_per_request_min"`
	Recency         float64        `json:"recent_screenshots_visible"` // share of the last 10 tool screenshots each request carries, mean; NaN without screenshots
	FrontierGap     *float64       `json:"frontier_gap,omitempty"`     // cost over the hindsight frontier's at the same images per request (a row that failed requests is not billed for them)
	LargestRequest  int            `json:"largest_request_bytes"`
	BytesSent       int64          `json:"request_bytes"`           // every request body, in total
	BytesUploaded   int64          `json:"file_upload_bytes"`       // Files API uploads (+files rows)
	LargestPrompt   int            `json:"largest_prompt_accepted"` // tokens, of a request the provider answered
	FinalImages     int            `json:"images_in_last_request"`
	StoredBytes     int64          `json:"stored_image_bytes"`
	UniqueBytes     int64          `json:"unique_image_bytes"`
	Removed         map[string]int `json:"images_removed_by_reason"`
	Recalled        int            `json:"images_recalled,omitempty"` // by the recall model (Config.Recall)
	// Recovered counts the refusals as too long (overflow) the agent
	// answered by compacting, its request then answered, and the summary
	// requests refused and asked again without their images: how an agent
	// that compacts only when refused compacts (claude-code 2.1.332). Not
	// failures.
	Recovered int     `json:"refusals_recovered,omitempty"`
	Series    []Point `json:"series"`
}

// Point is the state after one step: cumulative dollars and the size of
// that step's prompt (what the provider counted, sent or refused).
type Point struct {
	Dollars float64 `json:"dollars"`
	Context int     `json:"context_tokens"`
	Failed  bool    `json:"failed,omitempty"` // the step's request was refused (by the provider or imgctx)
}

// MarshalJSON writes NaN shares (nothing written, no screenshot) as null.
func (r PolicyReport) MarshalJSON() ([]byte, error) {
	type plain PolicyReport
	out := struct {
		plain
		Share   *float64 `json:"image_removal_write_share"`
		Recency *float64 `json:"recent_screenshots_visible"`
	}{plain: plain(r)}
	if !math.IsNaN(r.ImageWriteShare) {
		out.Share = &r.ImageWriteShare
	}
	if !math.IsNaN(r.Recency) {
		out.Recency = &r.Recency
	}
	return json.Marshal(out)
}

// Format is the wire a profile's provider speaks.
func Format(p tokens.Profile) (string, error) {
	switch p.Family {
	case "anthropic", "openai", "gemini":
		return p.Family, nil
	}
	return "", fmt.Errorf("profile %s: the emulated provider speaks anthropic, openai and gemini, not %q", p.Name, p.Family)
}

// Run simulates every policy in turn.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	format, err := Format(cfg.Profile)
	if err != nil {
		return nil, err
	}
	if cfg.Profile.Prices == nil {
		return nil, fmt.Errorf("profile %s has no prices: give them (--prices)", cfg.Profile.Name)
	}
	if cfg.N <= 0 {
		cfg.N = 3
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = 10
	}
	if cfg.KeepNewest <= 0 {
		cfg.KeepNewest = 5
	}
	peers := Peers(cfg.N, cfg.Chunk, cfg.KeepNewest)
	front := cmp.Or(cfg.SightsFront, "imgctx")
	i := slices.IndexFunc(peers, func(p Peer) bool { return p.Name == front && p.fronts() })
	if i < 0 {
		return nil, fmt.Errorf("the dial's positions sit in front of an imgctx row's agent: %q is none (want one of %v)", front, Fronts)
	}
	peers = append(peers, SightPeers(peers[i], cfg.Sights)...)
	if cfg.Workload.Recorded == nil {
		peers = append(peers, RecallPeers(peers, cfg.Recall)...)
	}
	if cfg.FileIDs {
		peers = append(peers, FilesPeers(peers)...)
	}
	if len(cfg.Policies) > 0 {
		var chosen []Peer
		for _, asked := range cfg.Policies {
			found := false
			for _, p := range peers {
				if matches(p.Name, asked) {
					found = true
					// Each row once, asked for by two names or not
					// ("ref-loop" selects ref-loop-cached too).
					if !slices.ContainsFunc(chosen, func(q Peer) bool { return q.Name == p.Name }) {
						chosen = append(chosen, p)
					}
				}
			}
			if !found {
				return nil, fmt.Errorf("unknown policy %q (want one of %v)", asked, Policies)
			}
		}
		peers = chosen
	}
	w := cfg.Workload
	if w.Recorded != nil {
		if fam := recordedWires[w.Format].family; fam != format {
			return nil, fmt.Errorf("the recording holds %s bodies; profile %s (model %s) is a %s provider: give --model one of a %s profile", w.Format, cfg.Profile.Name, cfg.Model, format, fam)
		}
		cfg.NoFrontier = true
		peers = slices.DeleteFunc(peers, func(p Peer) bool { return !p.replays() })
	}
	if cfg.CompactAt <= 0 || cfg.CompactAt > 1 {
		cfg.CompactAt = 1
	}
	rep := &Report{Workload: w.Name, Model: cfg.Model, Profile: cfg.Profile.Name, Format: format, Steps: len(w.Steps) + len(w.Recorded), Window: cfg.Profile.ContextWindow,
		Images: len(w.Images), Occurrences: w.Occurrences, Prices: *cfg.Profile.Prices, Notes: slices.Clone(w.Notes)}
	if w.Recorded != nil {
		rep.Format = w.Format
	}
	for _, im := range w.Images {
		rep.ImageBytes += int64(im.Bytes)
	}
	if len(w.Images) > 0 {
		rep.ImageBytes /= int64(len(w.Images))
	}
	// The policies run side by side, one a core: each has its own
	// provider, clock and gateway; what blocks cost is shared.
	counts := &Counts{}
	rep.Policies = make([]PolicyReport, len(peers))
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, peer := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				errs[i] = err
				return
			}
			r := &runner{cfg: cfg, format: format, peer: peer, policy: peer.Name, counts: counts, removed: map[string]int{}, refused: map[string]int{}, recovered: map[int]bool{}}
			pr, err := r.run(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", peer.Name, err)
				return
			}
			rep.Policies[i] = *pr
			runtime.GC()
			debug.FreeOSMemory()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !cfg.NoFrontier {
		f, err := HindsightFrontier(w, cfg.Profile)
		switch {
		case err != nil:
			rep.Notes = append(rep.Notes, "no hindsight frontier: "+err.Error())
		case len(f.Points) == 0:
			rep.Notes = append(rep.Notes, "no hindsight frontier: even with every image removed some request passes the window or a limit "+
				"(the history's text outgrows the window), and the frontier does not model compaction")
		default:
			rep.Frontier = f
			for i := range rep.Policies {
				p := &rep.Policies[i]
				if c, ok := f.CostAt(p.ImagesMean); ok && c > 0 {
					gap := p.Dollars/c - 1
					p.FrontierGap = &gap
				}
			}
		}
	}
	rep.Notes = append(rep.Notes, rep.Reading()...)
	if relief := cfg.Engine.WindowRelief(); cfg.CompactAt > relief {
		for _, p := range rep.Policies {
			if n := p.Removed[string(reason.Window)]; n > 0 && strings.HasPrefix(p.Policy, "imgctx") && p.Compacts != "" {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: its window relief (%.0f%% of the window) took %d images out before the agent's own compaction (at %.0f%%), which comes that much later; for an agent that compacts past the relief, proxy.window_relief: 1 (docs/config.md).",
					p.Policy, 100*relief, n, 100*cfg.CompactAt))
				break
			}
		}
	}
	return rep, nil
}

// runner plays the workload under one policy: the agent's transcript,
// what it sends, and where.
type runner struct {
	cfg           Config
	format        string
	peer          Peer
	policy        string
	counts        *Counts
	clock         *Clock
	prov          *Provider
	client        *upstream.Client
	gw            http.Handler
	images        imagestore.Store
	transcript    []Msg
	lastPrompt    int
	compactions   int
	removed       map[string]int
	summaryN      int
	body          bytes.Buffer   // the request being sent, reused
	refused       map[string]int // requests imgctx refused itself, by status
	replayed      replayState    // a byte replay's peer rule
	stepAt        int            // the step being played
	stepAdds      int            // the messages the step appended (compact keeps them)
	recovered     map[int]bool   // bills of refusals the agent compacted on, sending again with success
	recoveredHere int            // refusals as too long imgctx answered itself (proxy.client_window), likewise
	tooLong       bool           // the last refusal imgctx answered itself was as too long
	scheduled     int            // images a Schedule peer removed so far
	recall        recallState
	recalledN     int // images the model recalled
}

// through reports whether the policy's requests go through imgctx.
func (r *runner) through() bool { return r.peer.Through }

func (r *runner) run(ctx context.Context) (*PolicyReport, error) {
	r.clock = NewClock()
	r.prov = NewProvider(r.cfg.Profile, r.clock, r.counts)
	if f := r.cfg.Received; f != nil {
		r.prov.Received = func(b []byte) { f(r.policy, b) }
	}
	r.client = &upstream.Client{Format: upstream.Format(r.format), BaseURL: "http://provider.sim", APIKey: "sim", HTTP: &http.Client{Transport: r.prov.Transport()}, MaxRetries: -1}
	if r.through() {
		r.images = imagestore.Verified{Store: &imagestore.Mem{}}
		table, err := tokens.Default().With(r.cfg.Profile)
		if err != nil {
			return nil, err
		}
		ec := r.cfg.Engine
		if r.peer.Dial {
			ec.Keep.Hold, ec.Keep.Sight = true, r.peer.Sight
		}
		ec.UpstreamFiles = r.peer.Files
		e := &engine.Engine{Config: ec, Images: r.images, Sessions: &session.Mem{}, Profiles: table, Upstream: r.client,
			Now: r.clock.Now, Log: slog.New(slog.DiscardHandler),
			Sink: func(ev engine.Event) {
				if ev.Kind == "removed" {
					r.removed[string(ev.Reason)]++
					if ev.Detail == "image" {
						r.removedImage(ev.Ref)
					}
				}
			}}
		srv := gateway.New(gateway.Config{ProxyKeepOff: r.peer.KeepOff || r.cfg.KeepOff, Recall: r.peer.Recall}, e, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		// Its request log's writer would otherwise keep the whole run —
		// store, engine, held request bodies — alive after it: a matrix of
		// runs in one process grew past 20 GB.
		defer srv.Close()
		r.gw = srv.Handler()
	}
	var steps []stepInfo
	var err error
	if r.cfg.Workload.Recorded != nil {
		steps, err = r.replay(ctx)
	} else {
		steps, err = r.play(ctx)
	}
	if err != nil {
		return nil, err
	}
	return r.report(ctx, steps), nil
}

// stepInfo is what the report needs of one step.
type stepInfo struct {
	bills     []int // indexes into the provider's bills
	main      int   // the bill of the step's main request, -1 if none
	cold      bool  // after a gap longer than the cache TTL: cold by schedule
	hasImages bool
	recent    []string // imageKey of the last 10 tool screenshots attached so far
}

// billsSince lists the provider's bills from index before on: what one
// step cost.
func (r *runner) billsSince(before int) []int {
	var out []int
	for b := before; b < len(r.prov.Bills()); b++ {
		out = append(out, b)
	}
	return out
}

// ttl is the provider's cache lifetime, for what counts as a cold start.
func (r *runner) ttl() time.Duration {
	if ttl := r.cfg.Profile.Cache.TTL; ttl > 0 {
		return ttl
	}
	return 5 * time.Minute
}

// play runs a built-in (or exported) workload: the agent's transcript,
// its own image rule and compaction, rendered at each step.
func (r *runner) play(ctx context.Context) ([]stepInfo, error) {
	w := r.cfg.Workload
	steps := make([]stepInfo, len(w.Steps))
	ttl := r.ttl()
	seenImage := false
	var shots []string
	for i, st := range w.Steps {
		r.stepAt = i
		r.clock.Advance(st.Think)
		if st.Reset {
			r.transcript = nil
		}
		r.transcript = append(r.transcript, cloneMsgs(st.Add)...)
		r.stepAdds = len(st.Add)
		for _, m := range st.Add {
			seenImage = seenImage || hasImage(m)
			for _, p := range m.Parts {
				if p.Result != nil {
					for _, in := range p.Result.Parts {
						if in.Image != nil && in.Image.Pages == 0 {
							shots = append(shots, in.Image.key())
						}
					}
				}
			}
		}
		before := len(r.prov.Bills())
		if n, err := r.recallDue(ctx, i); err != nil {
			return nil, err
		} else {
			r.recalledN += n
		}
		main, err := r.step(ctx, estimate(r.cfg.Profile, st.Add))
		if err != nil {
			return nil, err
		}
		steps[i] = stepInfo{main: main, cold: i == 0 || st.Think > ttl, hasImages: seenImage, recent: shots[max(0, len(shots)-10):], bills: r.billsSince(before)}
		if r.cfg.Progress != nil {
			r.cfg.Progress(r.policy, i+1, len(w.Steps))
		}
	}
	return steps, nil
}

// report sums what the provider billed into the policy's row.
func (r *runner) report(ctx context.Context, steps []stepInfo) *PolicyReport {
	w := r.cfg.Workload
	// The report, from what the provider billed.
	bills := r.prov.Bills()
	pr := &PolicyReport{Policy: r.policy, Reproduces: r.peer.Reproduces, Compactions: r.compactions, Compacts: r.peer.Compact, Removed: r.removed, FailedBy: map[string]int{}, ImagesMin: -1, Recalled: r.recalledN,
		BytesUploaded: r.prov.Uploaded()}
	prices := *r.cfg.Profile.Prices
	var dollars float64
	var writes, imageRewrites, read, prompt int64
	var imagesSum, imagesN int
	var recency float64
	recentN := 0
	for _, st := range steps {
		for _, bi := range st.bills {
			b := bills[bi]
			pr.Requests++
			pr.LargestRequest = max(pr.LargestRequest, b.Bytes)
			pr.BytesSent += int64(b.Bytes)
			if b.Failed != "" && r.recovered[bi] {
				pr.Recovered++
				continue
			}
			if b.Failed != "" {
				pr.Failed++
				pr.FailedBy[b.Failed]++
				continue
			}
			pr.LargestPrompt = max(pr.LargestPrompt, b.Prompt)
			pr.Input += int64(b.Input)
			pr.CacheRead += int64(b.CacheRead)
			pr.CacheWrite += int64(b.CacheWrite + b.CacheWrite1h)
			pr.Output += int64(b.Output)
			dollars += (float64(b.Input)*prices.Input + float64(b.CacheRead)*prices.CacheRead + float64(b.CacheWrite)*prices.CacheWrite +
				float64(b.CacheWrite1h)*prices.CacheWrite1h + float64(b.Output)*prices.Output) / 1e6
			writes += int64(b.CacheWrite + b.CacheWrite1h)
			if b.Kind != "main" {
				continue
			}
			if b.Break {
				pr.PrefixBreaks++
				if b.BreakCause == "image" {
					pr.ImageBreaks++
					imageRewrites += int64(b.Rewritten)
				}
			}
		}
		ctxTokens := 0
		if st.main >= 0 {
			b := bills[st.main]
			ctxTokens = b.Prompt
			pr.FinalImages = b.Images
			if b.Failed == "" {
				if !st.cold {
					read += int64(b.CacheRead)
					prompt += int64(b.Prompt)
				}
				if len(st.recent) > 0 {
					have := 0
					for _, k := range st.recent {
						if slices.Contains(b.Keys, k) {
							have++
						}
					}
					recency += float64(have) / float64(len(st.recent))
					recentN++
				}
				if st.hasImages {
					imagesSum += b.Images
					imagesN++
					if pr.ImagesMin < 0 || b.Images < pr.ImagesMin {
						pr.ImagesMin = b.Images
					}
				}
			}
		}
		failed := st.main < 0 || bills[st.main].Failed != ""
		pr.Series = append(pr.Series, Point{Dollars: dollars, Context: ctxTokens, Failed: failed})
	}
	pr.Dollars = dollars
	pr.Recovered += r.recoveredHere
	for why, n := range r.refused {
		pr.Requests += n
		pr.Failed += n
		pr.FailedBy[why] += n
	}
	pr.ImageWriteShare = math.NaN()
	if writes > 0 {
		pr.ImageWriteShare = float64(imageRewrites) / float64(writes)
	}
	if prompt > 0 {
		pr.SteadyHitRate = float64(read) / float64(prompt)
	}
	if imagesN > 0 {
		pr.ImagesMean = float64(imagesSum) / float64(imagesN)
	}
	pr.Recency = math.NaN() // no screenshot in the workload
	if recentN > 0 {
		pr.Recency = recency / float64(recentN)
	}
	pr.ImagesMin = max(pr.ImagesMin, 0)
	for _, im := range w.Images {
		pr.UniqueBytes += int64(im.Bytes)
	}
	pr.StoredBytes = w.OccBytes // an agent's transcript holds every attachment
	if r.images != nil {
		pr.StoredBytes = 0
		r.images.List(ctx, imagestore.DefaultTenant, func(in imagestore.Info) error { pr.StoredBytes += in.Size; return nil })
	}
	return pr
}

// step sends the step's request under the policy: the agent's own image
// handling and compaction first, then the request, compacting and
// retrying once when the provider refuses it (an agent that never
// compacts does neither). It returns the provider's bill index of the
// main request, or -1.
func (r *runner) step(ctx context.Context, added int) (int, error) {
	compacts := r.peer.Compact != ""
	if compacts && r.compactsNow(r.lastPrompt+added) {
		if err := r.compact(ctx); err != nil {
			return -1, err
		}
	}
	r.evict()
	refusedBill, refusedHere := -1, false // the first attempt's refusal as too long, by the provider or by imgctx
	for attempt := 0; ; attempt++ {
		idx := len(r.prov.Bills())
		status, usage, err := r.send(ctx, "main", r.transcript, false)
		if err != nil {
			return -1, err
		}
		if len(r.prov.Bills()) == idx {
			// imgctx answered itself: it refused the request (a body over
			// server.max_body_bytes, say). The agent sees an error as
			// from the provider.
			if compacts && attempt == 0 && r.tooLong {
				// As too long, as the provider would have refused the
				// client's own history (proxy.client_window): it
				// compacts, as without imgctx; a failure if its retry is
				// refused too.
				refusedHere = true
			} else {
				r.refused[fmt.Sprintf("imgctx_%d", status)]++
				if refusedHere {
					r.refused["imgctx_400"]++
				}
				if !compacts || attempt > 0 {
					return -1, nil
				}
			}
			if err := r.compact(ctx); err != nil {
				return -1, err
			}
			r.evict()
			continue
		}
		if status == 200 {
			r.lastPrompt = usage
			// Refused, compacted, answered: how an agent compacting only
			// when refused goes on, not a failure.
			if refusedBill >= 0 {
				r.recovered[refusedBill] = true
			}
			if refusedHere {
				r.recoveredHere++
			}
			return len(r.prov.Bills()) - 1, nil
		}
		if !compacts || attempt > 0 {
			if refusedHere {
				r.refused["imgctx_400"]++ // its retry failed too
			}
			return len(r.prov.Bills()) - 1, nil
		}
		if bills := r.prov.Bills(); bills[len(bills)-1].Failed == "overflow" {
			// Refused as too long: claude-code 2.1.332 compacts and goes
			// on (scripts/agentcheck). A refusal for the images or the
			// bytes it carries stays a failure, answered so or not.
			refusedBill = len(bills) - 1
		}
		if err := r.compact(ctx); err != nil {
			return -1, err
		}
		r.evict()
	}
}

// evict applies the agent's own image rule to its transcript.
func (r *runner) evict() {
	pe := r.peer
	switch {
	case pe.Schedule != nil:
		if n := pe.Schedule[r.stepAt] - r.scheduled; n > 0 {
			r.removeOldest(n, "hindsight", false, false)
			r.scheduled += n
		}
	case pe.AtLimit:
		lim := r.cfg.Profile.Limits.MaxImages
		if n := countImages(r.transcript, false); lim > 0 && n > lim {
			r.removeOldest(n-pe.Keep, "ceiling", false, pe.Drop)
		}
	case pe.Keep > 0:
		// The reference loop's arithmetic: images_to_remove = total -
		// images_to_keep, less its remainder by min_removal_threshold.
		over := countImages(r.transcript, pe.ToolOnly) - pe.Keep
		if over > 0 {
			over -= over % pe.Chunk
		}
		why := "chunked"
		if pe.Chunk == 1 {
			why = "newest_n"
		}
		r.removeOldest(over, why, pe.ToolOnly, pe.Drop)
	}
}

// removeOldest takes the n oldest images (tool images only, when
// toolOnly) out of the transcript: dropped from their tool result, or
// replaced by a placeholder.
func (r *runner) removeOldest(n int, why string, toolOnly, drop bool) {
	take := func(p Part) bool {
		if n > 0 && p.Image != nil && p.Image.Pages == 0 {
			r.removed[why]++
			n--
			return true
		}
		return false
	}
	for i := range r.transcript {
		parts := r.transcript[i].Parts
		for j := range parts {
			p := &parts[j]
			if p.Result != nil {
				kept := p.Result.Parts[:0:0]
				for _, in := range p.Result.Parts {
					switch {
					case !take(in):
						kept = append(kept, in)
					case !drop:
						kept = append(kept, Part{Removed: why})
					}
				}
				p.Result.Parts = kept
			} else if !toolOnly && take(*p) {
				*p = Part{Removed: why}
			}
		}
	}
}

// compact summarises the transcript as the agent last sent it, as
// claude-code does (2.1.332, scripts/agentcheck): one summary request,
// then the summary and the messages the step appended (its newest tool
// round) in place of the history. "shared" sends the history as it was
// sent (images, breakpoints) with the instruction after it, so the
// request reads what the last request cached; when that is refused (the
// history is over a limit), or for "fresh", the images are left out.
func (r *runner) compact(ctx context.Context) error {
	if r.peer.Compact == "transcript" {
		return r.compactTranscript(ctx)
	}
	cut := len(r.transcript) - r.stepAdds
	if cut <= 0 {
		return nil // nothing sent before this step
	}
	ask := append(cloneMsgs(r.transcript[:cut]), Msg{Role: "user", Parts: []Part{{Text: "Summarize the conversation so far so that the work can continue from the summary alone."}}})
	status := 0
	refused := -1 // the shared summary's refusal as too long
	if r.peer.Compact == "shared" {
		var err error
		before := len(r.prov.Bills())
		if status, _, err = r.send(ctx, "summary", ask, false); err != nil {
			return err
		}
		if bills := r.prov.Bills(); status != 200 && len(bills) > before && bills[len(bills)-1].Failed == "overflow" {
			refused = len(bills) - 1
		}
	}
	if status != 200 {
		stripped, _, err := r.send(ctx, "summary", ask, true)
		if err != nil {
			return err
		}
		if stripped == 200 && refused >= 0 {
			// The agent asks again without the images, as claude-code
			// does when its summary request is refused: not a failure.
			r.recovered[refused] = true
		}
	}
	r.summaryN++
	for _, m := range r.transcript[:cut] {
		r.removed["compaction"] += countImages([]Msg{m}, false)
	}
	g := &gen{rng: newRand(uint64(r.summaryN))}
	summary := Part{Text: "Summary of the earlier conversation: " + g.words(r.prov.SummaryOutput)}
	rest := cloneMsgs(r.transcript[cut:])
	if len(rest) > 0 && rest[0].Role == "user" {
		rest[0].Parts = append([]Part{summary}, rest[0].Parts...)
	} else {
		rest = append([]Msg{{Role: "user", Parts: []Part{summary}, Human: true}}, rest...)
	}
	r.transcript = rest
	r.compactions++
	r.lastPrompt = 0
	return nil
}

// path is where the wire's requests go.
func (r *runner) path() string {
	switch r.format {
	case "anthropic":
		return "/v1/messages"
	case "gemini":
		return "/v1beta/models/" + r.cfg.Model + ":generateContent"
	}
	return "/v1/chat/completions"
}

// send renders msgs and sends them (sendBody). It returns the status and
// the prompt tokens the answer's usage reports.
func (r *runner) send(ctx context.Context, kind string, msgs []Msg, strip bool) (int, int, error) {
	return r.sendUnder(ctx, kind, r.cfg.Workload.System, r.cfg.Workload.Tools, msgs, strip)
}

// sendUnder is send under another system prompt and tools.
func (r *runner) sendUnder(ctx context.Context, kind, system, tools string, msgs []Msg, strip bool) (int, int, error) {
	body := renderInto(&r.body, r.format, r.cfg.Model, system, tools, msgs, strip, r.peer.Breakpoints)
	h := http.Header{"Content-Type": {"application/json"}, "X-Sim-Kind": {kind}, "X-Imgctx-Session": {"sim-" + r.policy}}
	if r.format == "anthropic" {
		h.Set("Anthropic-Version", "2023-06-01")
	}
	return r.sendBody(ctx, r.path(), h, body)
}

// sendBody sends one request body as it stands: through the gateway for
// the imgctx rows, to the provider through the upstream client for the
// others.
func (r *runner) sendBody(ctx context.Context, path string, h http.Header, body []byte) (int, int, error) {
	var status int
	var answer []byte
	if r.through() {
		req := httptest.NewRequestWithContext(ctx, "POST", path, bytes.NewReader(body))
		req.Header = h
		rec := httptest.NewRecorder()
		r.gw.ServeHTTP(rec, req)
		status, answer = rec.Code, rec.Body.Bytes()
	} else {
		resp, err := r.client.Send(ctx, upstream.Request{Path: path, Header: h, Body: wire.BodyOf(body)})
		var we *wire.Error
		switch {
		case errors.As(err, &we):
			status = we.Status
		case err != nil:
			return 0, 0, err
		default:
			answer, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		}
	}
	if status != 200 {
		r.tooLong = r.client.DecodeError(status, nil, answer).Kind == wire.PromptTooLong
		return status, 0, nil
	}
	var u struct {
		Usage struct {
			Input       int `json:"input_tokens"`
			CacheWrite  int `json:"cache_creation_input_tokens"`
			CacheRead   int `json:"cache_read_input_tokens"`
			PromptTotal int `json:"prompt_tokens"`
		} `json:"usage"`
		Gemini struct {
			Prompt int `json:"promptTokenCount"`
		} `json:"usageMetadata"`
	}
	if err := json.Unmarshal(answer, &u); err != nil {
		return 0, 0, fmt.Errorf("answer: %v: %.200s", err, answer)
	}
	return status, u.Usage.Input + u.Usage.CacheWrite + u.Usage.CacheRead + u.Usage.PromptTotal + u.Gemini.Prompt, nil
}

func cloneMsgs(ms []Msg) []Msg {
	out := make([]Msg, len(ms))
	for i, m := range ms {
		out[i] = m
		out[i].Parts = slices.Clone(m.Parts)
		for j, p := range out[i].Parts {
			if p.Result != nil {
				res := *p.Result
				res.Parts = slices.Clone(res.Parts)
				out[i].Parts[j].Result = &res
			}
		}
	}
	return out
}

func hasImage(m Msg) bool { return countImages([]Msg{m}, false) > 0 }

// countImages counts the images of ms (not documents); tool images only
// when toolOnly.
func countImages(ms []Msg, toolOnly bool) int {
	n := 0
	is := func(p Part) bool { return p.Image != nil && p.Image.Pages == 0 }
	for _, m := range ms {
		for _, p := range m.Parts {
			if !toolOnly && is(p) {
				n++
			}
			if p.Result != nil {
				for _, in := range p.Result.Parts {
					if is(in) {
						n++
					}
				}
			}
		}
	}
	return n
}

// estimate is the agent's own guess of what appended messages add: four
// characters a token, images at the profile's rule.
func estimate(p tokens.Profile, ms []Msg) int {
	n := 0
	var walk func(parts []Part)
	walk = func(parts []Part) {
		for _, part := range parts {
			n += len(part.Text) / 4
			switch {
			case part.Image != nil && part.Image.Pages > 0:
				n += tokens.DocumentTokens(p, part.Image.Pages)
			case part.Image != nil:
				t, _ := tokens.ImageTokens(p, part.Image.W, part.Image.H, "")
				n += t
			}
			if part.Result != nil {
				walk(part.Result.Parts)
			}
		}
	}
	for _, m := range ms {
		walk(m.Parts)
	}
	return n
}
