package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/imgctx/imgctx/sim"
	"github.com/imgctx/imgctx/tokens"
	"github.com/spf13/cobra"
)

func newSimulateCmd(a *app) *cobra.Command {
	var (
		workload, model, policies, from, svg, page, prices, size, sights, sightsFront, recall string
		asJSON                                                                                bool
		n, chunk, keepNewest                                                                  int
		noFrontier, fileIDs                                                                   bool
		compactAt                                                                             float64
		p                                                                                     = sim.DefaultParams("computer-use")
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay an image-heavy agent workload under each image policy, against an emulated provider",
		Long: "simulate plays a seeded multi-turn workload (or a recorded session, --from) through an in-memory\n" +
			"provider that counts tokens with the model's tokenizer and image rule, caches prompts as the provider\n" +
			"documents (Anthropic breakpoints with their TTL and write/read prices, OpenAI automatic prefixes in\n" +
			"128-token steps), refuses prompts past the window and the image limits, and bills with the profile's\n" +
			"prices. Each policy runs the same steps on its own simulated clock: the agents' own rules as they\n" +
			"ship (the reference computer-use loop with and without caching, chunked newest-n, OSWorld-style,\n" +
			"ceiling-batch, claude-code's strip-on-compact, opencode's own compaction, one-a-request newest-n,\n" +
			"naive), ephemeral, and imgctx\n" +
			"through the gateway's own handler and engine (this config's engine settings), in front of a\n" +
			"claude-code-like agent and, as imgctx@naive, of the naive agent that never compacts (the row the\n" +
			"agents that never compact are judged against too). The hindsight\n" +
			"frontier is the cheapest schedule of removals for each level of images shown, knowing the future;\n" +
			"each row's distance to it is reported. No API key, no network.",
		Example: "  imgctx simulate\n  imgctx simulate --model gpt-4o --workload doc-review --svg cost.svg\n  imgctx simulate --from session.jsonl --json",
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tbl, err := a.cfg.ProfileTable()
			if err != nil {
				return err
			}
			var w *sim.Workload
			if from != "" {
				f, err := os.Open(from)
				if err != nil {
					return err
				}
				w, err = sim.FromFile(f, p.Think)
				f.Close()
				if err != nil {
					return err
				}
				if w.Model != "" && !cmd.Flags().Changed("model") {
					model = w.Model // the model the recording asked for
				}
			}
			profile, ok := tbl.Lookup(model)
			if !ok {
				return usageError{fmt.Errorf("no profile matches model %q (imgctx profiles lists them)", model)}
			}
			if prices != "" {
				pr, err := parsePrices(prices, profile.Prices)
				if err != nil {
					return usageError{err}
				}
				profile.Prices = pr
			}
			if !(compactAt > 0 && compactAt <= 1) {
				return usageError{fmt.Errorf("--compact-at %g: want a share of the window, over 0 and at most 1", compactAt)}
			}
			if size != "" {
				if _, err := fmt.Sscanf(size, "%dx%d", &p.Width, &p.Height); err != nil || p.Width <= 0 || p.Height <= 0 {
					return usageError{fmt.Errorf("--image-size %q: want WIDTHxHEIGHT, e.g. 1280x800", size)}
				}
			}
			if w == nil {
				// The workload's own defaults, under what the flags set.
				def, set := sim.DefaultParams(workload), cmd.Flags().Changed
				if !set("turns") {
					p.Turns = def.Turns
				}
				if !set("images-per-turn") {
					p.ImagesPerTurn = def.ImagesPerTurn
				}
				if !set("same") {
					p.Same = def.Same
				}
				if !set("image-size") {
					p.Width, p.Height = def.Width, def.Height
				}
				if !set("image-kb") {
					p.ImageKB = def.ImageKB
				}
				if !set("think") {
					p.Think = def.Think
				}
				if !set("turn-gap") {
					p.TurnGap, p.GapJitter = def.TurnGap, def.GapJitter
				}
				if !set("idle-every") {
					p.IdleEvery = def.IdleEvery
				}
				if !set("idle") {
					p.Idle = def.Idle
				}
				if w, err = sim.Build(workload, p); err != nil {
					return usageError{err}
				}
			}
			var list []string
			if policies != "" {
				list = strings.Split(policies, ",")
			}
			dial, err := parseSights(sights)
			if err != nil {
				return usageError{err}
			}
			if !slices.Contains(sim.Fronts, sightsFront) {
				return usageError{fmt.Errorf("--sights-front: %q is not imgctx in front of an agent (want one of %v)", sightsFront, sim.Fronts)}
			}
			rc, err := parseRecall(recall)
			if err != nil {
				return usageError{err}
			}
			prog := newProgress(a.stderr)
			rep, err := sim.Run(cmd.Context(), sim.Config{Workload: w, Model: model, Profile: profile, Policies: list,
				N: n, Chunk: chunk, KeepNewest: keepNewest, NoFrontier: noFrontier, CompactAt: compactAt, Engine: engineConfig(a.cfg), KeepOff: !a.cfg.Proxy.KeepTurnImages, Sights: dial, SightsFront: sightsFront, Recall: rc, FileIDs: fileIDs,
				Progress: func(policy string, step, steps int) { prog.update("simulate: %s, step %d of %d", policy, step, steps) }})
			prog.done()
			if err != nil {
				return err
			}
			if svg != "" {
				if err := writeFile(svg, rep.WriteSVG); err != nil {
					return err
				}
			}
			if page != "" {
				if err := writeFile(page, rep.WriteHTML); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.WriteTable(a.stdout)
			if svg != "" {
				fmt.Fprintf(a.stdout, "\nchart: %s\n", svg)
			}
			if page != "" {
				fmt.Fprintf(a.stdout, "page: %s\n", page)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&workload, "workload", "computer-use", strings.Join(sim.Workloads, ", "))
	f.StringVar(&model, "model", "claude-sonnet-4-6", "the model asked for; its profile gives the window, image rule, cache rules and prices")
	f.StringVar(&policies, "policies", "", "comma-separated policies to run (default all: "+strings.Join(sim.Policies, ",")+")")
	f.StringVar(&from, "from", "", "replay a recording byte for byte: one request body a line (Anthropic, OpenAI Chat, Responses, Gemini; bare or as {\"path\",\"time\",\"headers\",\"body\"}), or a sessions export (JSONL); --model defaults to the recorded one")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.StringVar(&svg, "svg", "", "write cumulative cost and prompt size per step, one line per policy, to this SVG file")
	f.StringVar(&page, "html", "", "write the report as one self-contained HTML page (the table, the frontier, the chart) to this file")
	f.StringVar(&prices, "prices", "", "override prices, USD per million tokens: input=3,output=15,cache_read=0.3,cache_write=3.75,cache_write_1h=6")
	f.IntVar(&p.Turns, "turns", p.Turns, "human turns")
	f.IntVar(&p.ImagesPerTurn, "images-per-turn", p.ImagesPerTurn, "screenshots per turn (computer-use, mixed); pasted diagrams in all (doc-review)")
	f.StringVar(&size, "image-size", "", "screenshot size, WIDTHxHEIGHT (default 1280x800; doc-review 1600x1200)")
	f.IntVar(&p.ImageKB, "image-kb", p.ImageKB, "incompressible KB in each image, as real screenshots weigh (0: small synthetic PNGs; tokens depend on the size only)")
	f.DurationVar(&p.Think, "think", p.Think, "time between two requests of a turn")
	f.DurationVar(&p.TurnGap, "turn-gap", p.TurnGap, "time before each human message")
	f.IntVar(&p.IdleEvery, "idle-every", p.IdleEvery, "an idle gap every so many turns (0: none)")
	f.DurationVar(&p.Idle, "idle", p.Idle, "length of an idle gap (past the cache TTL, the cache goes cold)")
	f.Float64Var(&p.Same, "same", p.Same, "share of screenshots identical to the one before (the screen did not change)")
	f.Uint64Var(&p.Seed, "seed", p.Seed, "workload seed")
	f.IntVar(&n, "n", 3, "chunked newest-n: tool images kept")
	f.IntVar(&chunk, "chunk", 10, "chunked newest-n: images removed only in multiples of this")
	f.BoolVar(&noFrontier, "no-frontier", false, "skip the hindsight frontier")
	f.StringVar(&recall, "recall", "", "the recall model, SHARE[:AFTER]: each imgctx row runs again (+recall) with markers naming recall handles and the model asking for SHARE of the removed images AFTER steps later (default 10), one request each time")
	f.BoolVar(&fileIDs, "file-ids", false, "run each imgctx row again (+files) with images by file id (upstream.file_ids auto): the report's bytes rows compare what each sends")
	f.StringVar(&sights, "sights", joinSights(sim.DefaultSights), "keep.sight positions run as imgctx rows of their own (imgctx-sight-S), comma-separated; empty: none")
	f.StringVar(&sightsFront, "sights-front", "imgctx", "the imgctx row whose agent the --sights positions sit in front of: "+strings.Join(sim.Fronts, ", ")+" (rows named ROW-sight-S; imgctx's agent is claude-code-like)")
	f.IntVar(&keepNewest, "keep-newest", 5, "ceiling-batch: images kept when it evicts at the provider's image limit")
	f.Float64Var(&compactAt, "compact-at", 1, "share of the window past which the agent compacts its history (every policy but naive and opencode's); 1: only when refused, as claude-code 2.1.332 does (0.775: 2.0.77 on a 200,000-token window)")
	return cmd
}

// parsePrices reads key=value pairs over a base (nil: all zero).
func parsePrices(s string, base *tokens.Prices) (*tokens.Prices, error) {
	var p tokens.Prices
	if base != nil {
		p = *base
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f < 0 {
			return nil, fmt.Errorf("--prices: %q is not key=dollars", kv)
		}
		switch k {
		case "input":
			p.Input = f
		case "output":
			p.Output = f
		case "cache_read":
			p.CacheRead = f
		case "cache_write":
			p.CacheWrite = f
		case "cache_write_1h":
			p.CacheWrite1h = f
		default:
			return nil, fmt.Errorf("--prices: unknown key %q (input, output, cache_read, cache_write, cache_write_1h)", k)
		}
	}
	return &p, nil
}

// parseSights reads --sights: dial positions, each 0 or more.
func parseSights(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("--sights: %q is not a keep.sight (a number, 0 or more)", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseRecall reads --recall: SHARE[:AFTER], "" for none.
func parseRecall(s string) (sim.Recall, error) {
	if s = strings.TrimSpace(s); s == "" {
		return sim.Recall{}, nil
	}
	share, after, hasAfter := strings.Cut(s, ":")
	rc := sim.Recall{After: 10}
	v, err := strconv.ParseFloat(share, 64)
	if err != nil || v <= 0 || v > 1 || math.IsNaN(v) {
		return sim.Recall{}, fmt.Errorf("--recall: %q is not a share of the removed images (more than 0, at most 1)", share)
	}
	rc.Share = v
	if hasAfter {
		if rc.After, err = strconv.Atoi(after); err != nil || rc.After < 1 {
			return sim.Recall{}, fmt.Errorf("--recall: %q is not a number of steps (1 or more)", after)
		}
	}
	return rc, nil
}

func joinSights(v []float64) string {
	var parts []string
	for _, f := range v {
		parts = append(parts, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strings.Join(parts, ",")
}

// writeFile writes a file with write, closing it whatever happens.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
