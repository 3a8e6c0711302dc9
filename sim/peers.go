package sim

import (
	"fmt"
	"strings"
)

// A Peer is an image policy as an agent or a gateway ships it: what it
// removes and when, where its cache breakpoints go, and how it compacts.
// Each reproduces something named in Reproduces; a row's parameters are
// shown in its name.
type Peer struct {
	Name       string
	Reproduces string
	// Keep and Chunk: chunked newest-n. The newest Keep tool images stay;
	// the older ones go only in multiples of Chunk (Chunk 1: one a
	// request). 0 Keep: no such rule.
	Keep, Chunk int
	// AtLimit: ceiling-batch. Nothing is removed until the request would
	// pass the provider's image limit; then all but the newest Keep go.
	AtLimit bool
	// Drop: removed images are dropped from the tool result (the
	// reference loop); otherwise a text placeholder takes their place.
	Drop bool
	// ToolOnly: only tool-result images are removed, as the reference
	// loop counts them.
	ToolOnly    bool
	Breakpoints int // lastBreakpoint, turnBreakpoints or noBreakpoints (Anthropic)
	// Compact: how the agent compacts past CompactAt of the window or on
	// a refusal: "" never; "shared" the history as last sent plus the
	// summary instruction, so the summary request reads the cache, then the
	// summary and the step's messages (claude-code 2.1.332);
	// "fresh" the history with its images left out (a cache miss);
	// "transcript" the whole history, the current turn's steps too, as
	// one text message (opencode, compactTranscript).
	Compact string
	// Reserve, when set, is the room the agent keeps for its answer: it
	// compacts once the prompt reaches the window less min(Reserve, the
	// model's output cap), not past CompactAt (opencode).
	Reserve int
	// Through: requests go through imgctx's gateway and engine; KeepOff
	// turns keep-turn-images off there (ephemeral).
	Through, KeepOff bool
	// Dial, for an imgctx row: keep.sight set to Sight instead of the
	// config's.
	Dial  bool
	Sight float64
	// Files: the imgctx row sends images by file id (FilesPeers).
	Files bool
	// Schedule, when set, is a frontier point's schedule played as a
	// policy: the oldest Schedule[i] images removed at step i.
	Schedule []int
	// Recall, for an imgctx row: markers carry recall handles and the
	// model recalls by Config.Recall.
	Recall bool
}

// Peers returns the policies compared, in report order: the agents' own
// rules as they ship, then imgctx. n and chunk set the chunked row.
//
// The chunked rows follow anthropic-quickstarts
// computer-use-demo/computer_use_demo/loop.py,
// _maybe_filter_to_n_most_recent_images (read at commit 0313b3ec): only
// tool_result images are counted; images_to_remove = total - keep, less its
// remainder by min_removal_threshold (10); the oldest are dropped from their
// tool result. The ref-loop rows' later parameters (threshold equal to N,
// no truncation with caching on) are not in that copy.
func Peers(n, chunk, keepNewest int) []Peer {
	return []Peer{
		{Name: "naive", Reproduces: "an agent that sends its whole history and never compacts", Breakpoints: lastBreakpoint},
		{Name: "newest-3/1", Reproduces: "newest-n removing one image a request: the cache-breaking bug an agent shipped and fixed (known-bad baseline)",
			Keep: 3, Chunk: 1, Compact: "fresh"},
		{Name: "ref-loop", Reproduces: "anthropic-quickstarts computer-use-demo sampling_loop where prompt caching is off (Bedrock, Vertex): " +
			"only_n_most_recent_images=3, min_removal_threshold=image_truncation_threshold=3, images dropped from tool results, no breakpoints, no compaction",
			Keep: 3, Chunk: 3, Drop: true, ToolOnly: true, Breakpoints: noBreakpoints},
		{Name: "ref-loop-cached", Reproduces: "the same loop on the Anthropic API: prompt caching on, so no image truncation at all " +
			"(only_n_most_recent_images = 0), breakpoints on the 3 most recent user turns and the system prompt, no compaction",
			Breakpoints: turnBreakpoints},
		{Name: fmt.Sprintf("chunked-%d/%d", n, chunk), Reproduces: fmt.Sprintf("chunked newest-n with caching: keep %d tool images, remove in chunks of %d "+
			"(the reference loop's original min_removal_threshold=10), claude-code's breakpoints and compaction", n, chunk),
			Keep: n, Chunk: chunk, Drop: true, ToolOnly: true, Compact: "shared"},
		{Name: "osworld-10/20", Reproduces: "OSWorld-style agents: keep the 10 newest screenshots, remove in chunks of 20",
			Keep: 10, Chunk: 20, Drop: true, ToolOnly: true, Compact: "shared"},
		{Name: fmt.Sprintf("ceiling-batch-%d", keepNewest), Reproduces: fmt.Sprintf("agents fixed after the provider's image-limit refusal: "+
			"nothing removed until the next request would pass the limit, then all but the %d newest at once", keepNewest),
			Keep: keepNewest, AtLimit: true, Compact: "shared"},
		{Name: "strip-on-compact", Reproduces: "claude-code 2.1.332: every image kept until the history is compacted (a cache-sharing summary request of what it last sent), then only its newest tool round's",
			Compact: "shared"},
		{Name: "opencode", Reproduces: "opencode 1.18.33 as it ships (read from its bundle): every image kept (pruning is off by default); " +
			"compacts, mid-turn too, once the prompt reaches the window less min(32,000, the model's output cap): the whole history summarised " +
			"from a text transcript, images named, tool outputs cut at 2,000 characters, under its own prompt and no tools; then the summary, " +
			"the newest turns within its tail budget by its own estimate (base64 counted: no screenshot fits), and a continue message; " +
			"breakpoints on the system prompt and the last two messages",
			Compact: opencode.Compact, Reserve: opencode.Reserve, Breakpoints: opencode.Breakpoints},
		{Name: "ephemeral", Reproduces: "imgctx with proxy.keep_turn_images off: each tool image shown once", Through: true, KeepOff: true, Compact: "shared"},
		{Name: "imgctx", Reproduces: "imgctx serve's defaults (this config's engine settings) in front of a claude-code-like agent", Through: true, Compact: "shared"},
		{Name: "imgctx@opencode", Reproduces: "imgctx serve's defaults in front of opencode as it ships (its compaction, its reserve, its breakpoints)",
			Through: true, Compact: opencode.Compact, Reserve: opencode.Reserve, Breakpoints: opencode.Breakpoints},
		{Name: NaiveImgctx, Reproduces: "imgctx serve's defaults in front of the naive agent: its whole history, its breakpoint on the last block, never compacting",
			Through: true},
	}
}

// opencode is how opencode compacts and where it puts its breakpoints, for
// its row and imgctx's in front of it.
var opencode = Peer{Compact: "transcript", Reserve: 32000, Breakpoints: lastTwoBreakpoints}

// NaiveImgctx is the imgctx row in front of an agent that never compacts.
// The agents that never compact (naive, ref-loop, ref-loop-cached) keep
// what a compacting agent's summary takes away, and imgctx cannot undo its
// client's compaction: they are judged against imgctx in front of an agent
// that, like them, never compacts, as well as against the imgctx rows in
// front of claude-code (Report.Losses). Its name is not "imgctx-…", so
// asking for imgctx (--policies imgctx) does not run it.
const NaiveImgctx = "imgctx@naive"

// judgesOnly reports whether the row is imgctx in front of another agent
// than the claude-code-like one (NaiveImgctx, imgctx@opencode): there to
// judge the peers that compact as its client does, it is not run again
// with recall or file ids, nor replayed from a recording, which holds its
// client's own compaction.
func (p Peer) judgesOnly() bool { return p.Through && strings.HasPrefix(p.Name, "imgctx@") }

// fronts reports whether the row is imgctx at its defaults in front of
// an agent (Fronts).
func (p Peer) fronts() bool { return p.Through && !p.KeepOff && !p.Dial }

// DefaultSights are the positions of the dial (keep.sight) simulate runs
// beside imgctx's default: from the cheapest to past cold starts.
var DefaultSights = []float64{0, 0.5, 0.9, 1.5, 2, 3}

// SightPeers returns an imgctx row (front: "imgctx", NaiveImgctx or
// "imgctx@opencode") at those positions of the dial, in front of the
// same agent: front-sight-S.
func SightPeers(front Peer, sights []float64) []Peer {
	var out []Peer
	for _, s := range sights {
		p := front
		p.Name = fmt.Sprintf("%s-sight-%g", front.Name, s)
		p.Reproduces = fmt.Sprintf("%s with keep.sight %g (the rest of this config's engine settings)", front.Name, s)
		p.Dial, p.Sight = true, s
		out = append(out, p)
	}
	return out
}
