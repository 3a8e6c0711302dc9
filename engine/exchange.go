package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire"
)

// exchange sends the live context and handles what comes back: window
// pressure before sending (images first, then compaction), the reactive net
// on prompt-too-long (replay without kept images, then compact and replay,
// then a clear error), and the cut-completion replay.
func (c *call) exchange(ctx context.Context) (*Result, error) {
	postpones := policy.PastHalfTheCut(c.st.Keep.Base, policy.KeptCost(c.st.Live), c.e.threshold(c.profile.ContextWindow))
	live, removed, ledger := c.e.priced(c.st.Live, c.profile, c.cacheWarm(), c.st.TurnStart, c.st.Keep.Ledger, nil, postpones)
	c.st.Keep.Ledger = ledger
	c.evicted(live, removed)
	if err := c.relieve(ctx); err != nil {
		return nil, err
	}
	live, removed = c.e.imageLimit(c.st.Live, c.profile, c.cacheWarm(), c.st.TurnStart, c.st.Keep.Ledger, nil)
	c.evicted(live, removed)
	var resp *response
	var err error
	netStep := 0 // 0 nothing done, 1 images removed, 2 compacted
	cutReplayed := false
	for {
		resp, err = c.send(ctx)
		var we *wire.Error
		if errors.As(err, &we) && we.Kind == wire.PromptTooLong {
			if netStep, err = c.reactive(ctx, netStep, we); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if resp.cut && !cutReplayed && c.windowFull(resp) {
			cutReplayed = true
			if kept := policy.KeptCost(c.st.Live); kept > 0 && kept >= resp.usage.Output {
				live, removed := policy.RemoveKept(c.st.Live, reason.Overflow)
				c.st.Live = live
				c.removed(removed)
				c.turn.InvalidateBase()
				c.emit(Event{Kind: "retried", Reason: reason.Overflow, Detail: "completion cut by a full window: replay without kept images"})
			} else {
				if err := c.compact(ctx, false); err != nil {
					return nil, err
				}
				c.emit(Event{Kind: "retried", Reason: reason.Compaction, Detail: "completion cut by a full window: replay after compaction"})
			}
			continue
		}
		break
	}
	c.turn.Observe(resp.usage, resp.cut)
	if resp.usage != nil {
		c.st.LastUsage = *resp.usage
	}
	c.st.Live = c.turn.Rewritten(c.st.Live)
	for _, ev := range c.turn.Events() {
		c.emit(Event{Kind: ev.Kind, Ref: ev.Ref, Reason: ev.Reason, Tokens: ev.Cost})
	}
	reply := resp.message
	c.st.Live = append(c.st.Live, reply)
	c.entries = append(c.entries, session.Entry{Message: &reply})
	if c.offersRecall() {
		answered, others, err := c.answerRecalls(ctx, reply)
		if err != nil {
			return nil, err
		}
		if answered > 0 && !others {
			// The model asked only imgctx: the turn goes on without the
			// client, the recalled images relayed like any tool's. The
			// result's usage is what every request of the call billed.
			c.recallRounds++
			res, err := c.exchange(ctx)
			if err == nil && resp.usage != nil {
				res.Usage = addUsage(res.Usage, *resp.usage)
			}
			return res, err
		}
	}
	end := !hasToolCalls(reply)
	if end {
		var removed []policy.Removal
		ledger := c.st.Keep.Ledger
		c.st.Live, removed, c.st.Keep = c.turn.Finish(c.st.Live)
		c.st.Keep.Ledger = ledger
		c.removed(removed)
		c.st.TurnOpen, c.st.Turn = false, nil
	} else {
		snap := c.turn.Snapshot()
		c.st.TurnOpen, c.st.Turn = true, &snap
	}
	return &Result{Message: reply, Usage: resp.usage, TurnEnd: end}, nil
}

// addUsage is u plus v (u nil: v).
func addUsage(u *chat.Usage, v chat.Usage) *chat.Usage {
	if u == nil {
		return &v
	}
	sum := chat.Usage{Prompt: u.Prompt + v.Prompt, CacheRead: u.CacheRead + v.CacheRead, CacheWrite: u.CacheWrite + v.CacheWrite,
		CacheWriteHour: u.CacheWriteHour + v.CacheWriteHour, Output: u.Output + v.Output}
	return &sum
}

func hasToolCalls(m chat.Message) bool {
	for _, p := range m.Parts {
		if _, ok := p.(chat.ToolCall); ok {
			return true
		}
	}
	return false
}

// windowFull tells a completion cut by the window from one cut by
// max_tokens: Anthropic says so; otherwise prompt and output fill it.
func (c *call) windowFull(r *response) bool {
	if r.windowFull {
		return true
	}
	return r.usage != nil && r.usage.Prompt+r.usage.Output >= c.profile.ContextWindow*98/100
}

// reactive is the net under prompt-too-long: first replay without kept
// images (no summary), then compact and replay, then give up clearly.
func (c *call) reactive(ctx context.Context, step int, cause *wire.Error) (int, error) {
	if step == 0 {
		live, removed := policy.RemoveKept(c.st.Live, reason.Overflow)
		if len(removed) > 0 {
			c.st.Live = live
			c.removed(removed)
			c.turn.InvalidateBase()
			c.emit(Event{Kind: "retried", Reason: reason.Overflow, Detail: "prompt too long: replay without kept images"})
			return 1, nil
		}
		step = 1
	}
	if step == 1 {
		if err := c.compact(ctx, false); err != nil {
			if errors.Is(err, policy.ErrNotWorthCompacting) {
				return 0, fmt.Errorf("%w: %v", ErrContextFull, cause)
			}
			return 0, err
		}
		c.emit(Event{Kind: "retried", Reason: reason.Compaction, Detail: "prompt too long: replay after compaction"})
		return 2, nil
	}
	return 0, fmt.Errorf("%w: %v", ErrContextFull, cause)
}

// relieve applies window pressure before a request: when the estimate
// passes the threshold, kept images leave first (one batch, down to the
// low-water mark); compaction runs only if that was not enough.
func (c *call) relieve(ctx context.Context) error {
	est := c.estimate()
	limit := c.e.threshold(c.profile.ContextWindow)
	if est <= limit {
		return nil
	}
	p := policy.Pressure{Estimate: est, Threshold: limit}
	if c.e.Keep.Holds(c.profile) {
		// Kept images may be far over the budget: one batch takes them
		// down to the budget's low-water mark.
		low := int(c.e.lowWater() * float64(c.e.Keep.Budget(c.profile.ContextWindow)))
		p.LowWater = min(limit-limit/10, est-max(0, policy.KeptCost(c.st.Live)-low))
	}
	live, removed, after := policy.EvictImages(c.st.Live, p, reason.Window)
	if after > limit && c.cacheWarm() {
		// Compaction is needed either way, and the provider still caches
		// the live prefix: summarise on it intact (evicting first would
		// break that prefix at the oldest image), then evict what the
		// summary left, if still needed.
		err := c.compact(ctx, true)
		switch {
		case err == nil:
			if est = c.estimate(); est > limit {
				live, removed, _ = policy.EvictImages(c.st.Live, policy.Pressure{Estimate: est, Threshold: limit}, reason.Window)
				c.evicted(live, removed)
			}
			return nil
		case !errors.Is(err, policy.ErrNotWorthCompacting) && !errors.Is(err, ErrContextFull):
			return err
		}
	}
	c.evicted(live, removed)
	if after <= limit {
		return nil
	}
	err := c.compact(ctx, false)
	if errors.Is(err, policy.ErrNotWorthCompacting) || errors.Is(err, ErrContextFull) {
		return nil // nothing to summarise yet, or too much to: let the upstream decide
	}
	return err
}

// evicted applies an eviction batch.
func (c *call) evicted(live []chat.Message, removed []policy.Removal) {
	if len(removed) > 0 {
		c.st.Live = live
		c.removed(removed)
		c.turn.InvalidateBase()
	}
}

// cacheWarm says whether the provider still caches the last request's
// prefix: it was sent within the cache TTL (an hour, up to the last
// turn's end, where the breakpoints keep that long).
func (c *call) cacheWarm() bool {
	ttl := c.e.cacheTTL()
	if c.hourCache() {
		ttl = max(ttl, time.Hour)
	}
	return !c.st.LastActivity.IsZero() && c.e.now().Sub(c.st.LastActivity) <= ttl
}

// hourCache says whether this session's breakpoints keep for an hour: the
// provider offers that lifetime (a price for its writes) and the
// conversation's pace pays for it (policy.Ledger.HourPays).
func (c *call) hourCache() bool {
	p := c.profile
	return c.e.Keep.HourCache && p.Cache.Breakpoints > 0 && p.Prices != nil && p.Prices.CacheWrite1h > 0 && c.st.Keep.Ledger.HourPays()
}

// estimate is the next prompt's size: the last measured prompt plus an
// estimate of what was appended since, or an estimate of it all.
func (c *call) estimate() int {
	counter := tokens.CounterFor(c.profile.Tokenizer)
	snap := c.turn.Snapshot()
	from, base := 0, 0
	if snap.Base.Valid && snap.Base.Messages <= len(c.st.Live) {
		from, base = snap.Base.Messages, snap.Base.Prompt
	}
	n := base
	for _, m := range c.st.Live[from:] {
		n += policy.TextTokens(m.Parts, counter) + tokens.MessageFraming
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			switch p := p.(type) {
			case chat.Image:
				if p.Cost > 0 {
					n += p.Cost
				} else if t, err := tokens.ImageTokens(c.profile, p.Width, p.Height, p.Detail); err == nil {
					n += t
				}
			case chat.Document:
				if p.Ref.Valid() { // sent natively: its pages count, not only its text
					n += tokens.DocumentTokens(c.profile, p.Pages)
				}
			}
			return true
		})
	}
	return n
}

// compact summarises a prefix of the live context through a side query to
// the same upstream, with slimmed input, and records it in the log.
// With share, the summary may be asked on the live prefix while the
// provider's cache is warm; after prompt-too-long or a window-cut answer
// that prefix is what did not fit, so only the slimmed query runs.
func (c *call) compact(ctx context.Context, share bool) error {
	var s policy.Summariser = summariser{c}
	if share {
		s = sharingSummariser{summariser{c}}
	}
	res, err := policy.Compact(ctx, c.st.Live, c.e.Compact, s)
	if err != nil {
		return err
	}
	rec := res.Record
	c.st.Live = res.Messages
	c.turn.InvalidateBase()
	switch {
	case c.st.TurnStart >= rec.To:
		c.st.TurnStart -= rec.To - rec.From - 1
	case c.st.TurnStart >= rec.From:
		// Cut inside the turn (a long tool loop): the summary, a user
		// message, now stands for its start.
		c.st.TurnStart = rec.From
	}
	c.entries = append(c.entries, session.Entry{Compaction: &rec})
	c.removed(res.Removed)
	how, kind := "slimmed side query", CompactedSummary
	if rec.Shared {
		how, kind = "cache-sharing, on the live prefix", CompactedShared
	}
	c.emit(Event{Kind: "compacted", Reason: reason.Compaction, Compaction: kind, Detail: fmt.Sprintf("summarised messages %d–%d (%d of %d characters; %s; %d images re-attached)",
		rec.From, rec.To, rec.PrefixChars, rec.TotalChars, how, rec.Restored)})
	return nil
}
