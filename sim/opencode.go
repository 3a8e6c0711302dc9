package sim

import (
	"context"
	"fmt"
	"strings"
)

// opencode's compaction, as its 1.18.33 bundle does it (the "opencode"
// peer): the bounds of the tail it keeps after a summary, and of each tool
// output in the transcript the summary is made from.
const (
	opencodeTailMin   = 2000
	opencodeTailMax   = 15000
	opencodeToolChars = 2000
	opencodeContinue  = "Continue if you have next steps, or stop and ask for clarification if you are unsure how to proceed."
)

// compactsNow reports whether the agent compacts before a request of
// about prompt tokens: past CompactAt of the window, or, for an agent that
// keeps room for its answer, once the rest of the window is reached. At a
// CompactAt of 1 it never does: it sends, and compacts when refused, as
// claude-code 2.1.332 does (scripts/agentcheck).
func (r *runner) compactsNow(prompt int) bool {
	if usable := r.usable(); usable > 0 {
		return prompt >= usable
	}
	return r.cfg.CompactAt < 1 && float64(prompt) > r.cfg.CompactAt*float64(r.cfg.Profile.ContextWindow)
}

// usable is the prompt an agent with a Reserve compacts at: the window
// less min(Reserve, the model's output cap); 0 without a Reserve, or with
// no room left.
func (r *runner) usable() int {
	if r.peer.Reserve == 0 {
		return 0
	}
	reserve := r.peer.Reserve
	if out := r.cfg.Profile.MaxOutput; out > 0 {
		reserve = min(reserve, out)
	}
	return max(r.cfg.Profile.ContextWindow-reserve, 0)
}

// compactTranscript is opencode's compaction: the whole history but its
// tail (tailStart) goes to one summary request as a text transcript
// (transcriptText), under the compaction agent's own prompt and no tools,
// so the request reads no image and shares no cache; the history is then
// that exchange, the tail, and a message to continue.
func (r *runner) compactTranscript(ctx context.Context) error {
	if len(r.transcript) == 0 {
		return nil
	}
	budget := min(opencodeTailMax, max(opencodeTailMin, r.usable()/4))
	at := tailStart(r.transcript, budget)
	if at == 0 {
		at = len(r.transcript)
	}
	head, tail := r.transcript[:at], r.transcript[at:]
	prompt := (&gen{rng: newRand(7)}).words(350) // its summary template and rules: about 350 tokens
	ask := []Msg{{Role: "user", Parts: []Part{{Text: transcriptText(head)}}}}
	if _, _, err := r.sendUnder(ctx, "summary", prompt, "[]", ask, false); err != nil {
		return err
	}
	r.summaryN++
	r.removed["compaction"] += countImages(head, false)
	g := &gen{rng: newRand(uint64(r.summaryN))}
	next := []Msg{{Role: "user", Parts: []Part{{Text: "What did we do so far?"}}},
		{Role: "assistant", Parts: []Part{{Text: g.words(r.prov.SummaryOutput)}}}}
	next = append(next, cloneMsgs(tail)...)
	r.transcript = append(next, Msg{Role: "user", Human: true, Parts: []Part{{Text: opencodeContinue}}})
	r.compactions++
	r.lastPrompt = 0
	return nil
}

// tailStart is where the tail opencode keeps after a summary begins: the
// newest whole turns (a human message and what follows it) within budget
// by its estimate; in the newest turn that does not fit whole, the first
// message from which the rest fits what is left of the budget. 0 is no
// tail.
func tailStart(msgs []Msg, budget int) int {
	var turns []int
	for i, m := range msgs {
		if m.Human {
			turns = append(turns, i)
		}
	}
	start, used, end := 0, 0, len(msgs)
	for k := len(turns) - 1; k >= 0; k-- {
		s := turns[k]
		if n := opencodeEstimate(msgs[s:end]); used+n <= budget {
			start, used, end = s, used+n, s
			continue
		}
		for o := s + 1; o < end; o++ {
			if opencodeEstimate(msgs[o:end]) <= budget-used {
				start = o
				break
			}
		}
		break
	}
	return start
}

// opencodeEstimate is opencode's guess of what messages weigh: a quarter
// of their JSON's characters, each image's base64 included.
func opencodeEstimate(msgs []Msg) int {
	n := 0
	var walk func([]Part)
	walk = func(parts []Part) {
		for _, p := range parts {
			n += len(p.Text) + 24
			if p.Image != nil {
				n += len(p.Image.B64) + 64
			}
			if p.Call != nil {
				n += len(p.Call.Name) + len(p.Call.Input) + 64
			}
			if p.Result != nil {
				walk(p.Result.Parts)
			}
		}
	}
	for _, m := range msgs {
		n += 32
		walk(m.Parts)
	}
	return n / 4
}

// transcriptText is the history as opencode's summary request carries it:
// a line a message part, each image named by its type, each tool output cut
// at opencodeToolChars.
func transcriptText(msgs []Msg) string {
	var b strings.Builder
	attached := func(w *strings.Builder, im *Image) {
		mt := im.MediaType
		if mt == "" {
			mt = "image/png"
		}
		fmt.Fprintf(w, "[Attached %s: file]", mt)
	}
	for _, m := range msgs {
		who := "[User]: "
		if m.Role == "assistant" {
			who = "[Assistant]: "
		}
		for _, p := range m.Parts {
			switch {
			case p.Result != nil:
				var out strings.Builder
				for _, in := range p.Result.Parts {
					out.WriteString(in.Text)
					if in.Image != nil {
						out.WriteByte('\n')
						attached(&out, in.Image)
					}
				}
				text := out.String()
				if len(text) > opencodeToolChars {
					text = text[:opencodeToolChars] + "\n[truncated]"
				}
				b.WriteString("[Tool result]: " + text)
			case p.Call != nil:
				fmt.Fprintf(&b, "[Assistant tool call]: %s(%s)", p.Call.Name, p.Call.Input)
			case p.Image != nil:
				attached(&b, p.Image)
			case p.Text != "":
				b.WriteString(who + p.Text)
			default:
				continue
			}
			b.WriteString("\n\n")
		}
	}
	return b.String()
}
