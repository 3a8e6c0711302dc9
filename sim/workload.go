package sim

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"math/rand/v2"
	"strings"
	"time"
)

// Image is one image of a workload: a PNG of the given size whose bytes
// differ by ID. Workload images are generated once and shared by every
// policy's run.
type Image struct {
	ID        int
	W, H      int
	Bytes     int    // encoded bytes
	B64       string // base64 of them
	MediaType string // "" means image/png; application/pdf for a document
	Pages     int    // a document's pages
	Origin    string // "tool" (a screenshot a tool returned) or "user" (pasted)
}

// key is the image's imageKey, as the provider names what it received.
func (im *Image) key() string { return imageKey(im.B64, len(im.B64)) }

// Part is one piece of a message: text, an image, a tool call, or a tool
// result holding text and images.
type Part struct {
	Text    string
	Image   *Image
	Removed string // an image taken out by the agent's policy: why (a placeholder is sent)
	Call    *Call
	Result  *Result
}

// Call is a tool call of the assistant.
type Call struct{ ID, Name, Input string }

// Result answers a call.
type Result struct {
	CallID string
	Parts  []Part
}

// Msg is one message of the agent's transcript.
type Msg struct {
	Role  string // "user" or "assistant"
	Parts []Part
	Human bool // a user message carrying the human's input (starts a turn)
}

// Step is one request of the workload: the messages the agent appends
// (the assistant's last reply, then the new user message or tool result),
// after the think time since the previous request.
type Step struct {
	Think time.Duration
	Add   []Msg
	// Reset replaces the agent's transcript with Add (a recorded client
	// that compacted its history).
	Reset bool
}

// Workload is a whole scripted session.
type Workload struct {
	Name   string
	System string
	Tools  string // JSON array of tool definitions (Anthropic shape; rendered for OpenAI too)
	Steps  []Step
	Images []*Image // every distinct image, in order of first use
	// Occurrences counts every image attachment (a screen that did not
	// change is attached again: same image, a second occurrence).
	Occurrences int
	OccBytes    int64
	// Recorded, when set, is a recording replayed byte for byte (Steps is
	// then empty): bodies of the Format wire ("anthropic", "openai",
	// "responses", "gemini"), for Model; Notes say what the replay does
	// not carry.
	Recorded []Recorded
	Format   string
	Model    string
	Notes    []string
}

// Params shape the built-in workloads.
type Params struct {
	Turns         int           // human turns
	ImagesPerTurn int           // screenshot tool rounds per turn (computer-use), pasted images (doc-review: in its first turns)
	Width, Height int           // screenshot size
	ImageKB       int           // incompressible bytes per image, to make the PNGs realistically large; 0: small synthetic PNGs
	Think         time.Duration // between two requests of a turn
	TurnGap       time.Duration // before a human message
	GapJitter     float64       // turn gaps drawn uniformly within TurnGap × (1 ± GapJitter)
	IdleEvery     int           // every so many turns, an idle gap (0: none)
	Idle          time.Duration
	Same          float64 // share of screenshots identical to the one before (the screen did not change)
	Seed          uint64
}

// DefaultParams are the built-in scenarios' settings. Images weigh what
// real PNG screenshots do (200 KB of incompressible pixels each, about
// 208 KB encoded), so request bytes and the providers' request-size limits
// are real; --image-kb 0 makes small synthetic PNGs (tokens depend on the
// size only).
func DefaultParams(workload string) Params {
	p := Params{Turns: 30, ImagesPerTurn: 8, Width: 1280, Height: 800, ImageKB: 200, Think: 6 * time.Second, TurnGap: 45 * time.Second,
		IdleEvery: 10, Idle: 20 * time.Minute, Same: 0.2, Seed: 1}
	switch workload {
	case "computer-use-steady":
		p.IdleEvery = 0
	case "browser":
		// Fast rounds, many screenshots; a 7-minute pause (just past the
		// 5-minute TTL) every 5 turns.
		p.Turns, p.ImagesPerTurn, p.Width, p.Height = 20, 15, 1280, 720
		p.Think, p.TurnGap, p.IdleEvery, p.Idle, p.Same = 2*time.Second, 30*time.Second, 5, 7*time.Minute, 0.3
	case "coding":
		// Long text and tool output; turn gaps of 1 to 9 minutes, on both
		// sides of the 5-minute TTL; an occasional screenshot, a pasted
		// image, a PDF.
		p.Turns, p.ImagesPerTurn, p.Think, p.TurnGap, p.GapJitter, p.IdleEvery, p.Same = 40, 4, 8*time.Second, 5*time.Minute, 0.8, 0, 0
	case "doc-review":
		p.Turns, p.ImagesPerTurn, p.Width, p.Height, p.Same = 60, 6, 1600, 1200, 0
	case "mixed":
		p.Turns, p.ImagesPerTurn = 40, 6
	}
	return p
}

// Workloads lists the built-in scenarios.
var Workloads = []string{"computer-use", "computer-use-steady", "browser", "coding", "doc-review", "mixed"}

// Build returns a built-in workload.
func Build(name string, p Params) (*Workload, error) {
	g := &gen{rng: newRand(p.Seed), p: p}
	w := &Workload{Name: name, System: g.words(3000), Tools: toolsJSON}
	switch name {
	case "computer-use", "computer-use-steady", "browser":
		for t := range p.Turns {
			g.humanTurn(w, t, 60, nil)
			g.toolLoop(w, p.ImagesPerTurn)
		}
	case "coding":
		// Each turn reads and edits files (tool output of 300 to 2,500
		// tokens); every fourth turn takes a screenshot of the app, every
		// tenth pastes one; turn 2 attaches a PDF (a spec).
		w.Tools = codingToolsJSON
		for t := range p.Turns {
			var pasted []*Image
			switch {
			case t == 1:
				pasted = []*Image{g.pdf(4)}
			case t%10 == 5:
				pasted = []*Image{g.image("user")}
			}
			g.humanTurn(w, t, 150, pasted)
			g.codingLoop(w, p.ImagesPerTurn, t%4 == 3)
		}
	case "doc-review":
		// Diagrams pasted in the first turns, then a long discussion.
		for t := range p.Turns {
			var pasted []*Image
			if t < 2 {
				for range (p.ImagesPerTurn + 1 - t) / 2 {
					pasted = append(pasted, g.image("user"))
				}
			}
			g.humanTurn(w, t, 400, pasted)
			g.answer = 2500
		}
	case "mixed":
		for t := range p.Turns {
			var pasted []*Image
			if t%5 == 0 {
				pasted = []*Image{g.image("user")}
			}
			g.humanTurn(w, t, 200, pasted)
			if t%2 == 0 {
				g.toolLoop(w, p.ImagesPerTurn)
			} else {
				g.answer = 1500
			}
		}
	default:
		return nil, fmt.Errorf("unknown workload %q (want %s)", name, strings.Join(Workloads, ", "))
	}
	w.Images, w.Occurrences, w.OccBytes = g.images, g.occ, g.occBytes
	return w, nil
}

// codingToolsJSON is a coding agent's tool set.
const codingToolsJSON = `[{"name":"read_file","description":"Read a file of the repository.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},` +
	`{"name":"edit_file","description":"Replace text in a file.","input_schema":{"type":"object","properties":{"path":{"type":"string"},"old":{"type":"string"},"new":{"type":"string"}},"required":["path","old","new"]}},` +
	`{"name":"screenshot","description":"Take a screenshot of the running app.","input_schema":{"type":"object","properties":{}}}]`

// toolsJSON is a computer-use agent's tool set.
const toolsJSON = `[{"name":"screenshot","description":"Take a screenshot of the screen.","input_schema":{"type":"object","properties":{}}},` +
	`{"name":"click","description":"Click at a point of the screen.","input_schema":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]}},` +
	`{"name":"type","description":"Type text at the cursor.","input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]`

type gen struct {
	rng      *rand.Rand
	p        Params
	images   []*Image
	last     *Image
	occ      int
	occBytes int64
	calls    int
	answer   int // tokens of the assistant's closing reply, appended with the next human message
	started  bool
}

var vocabulary = strings.Fields(`the screen shows a form with fields for name address and payment button menu ` +
	`window dialog error message table row column value chart diagram arrow service database queue cache ` +
	`request response latency user account settings page link image text report review change commit test ` +
	`deploy config option select field submit cancel open close next previous scroll click type search`)

// words returns about n tokens of plain English-like text.
func (g *gen) words(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[g.rng.IntN(len(vocabulary))])
	}
	return b.String()
}

func (g *gen) humanTurn(w *Workload, t int, tokens int, pasted []*Image) {
	gap := g.p.TurnGap
	if j := g.p.GapJitter; j > 0 {
		gap = time.Duration(float64(gap) * (1 - j + 2*j*g.rng.Float64())).Round(time.Second)
	}
	step := Step{Think: gap}
	if !g.started {
		step.Think = 0
		g.started = true
	} else if g.p.IdleEvery > 0 && t%g.p.IdleEvery == 0 {
		step.Think = g.p.Idle
	}
	if g.answer > 0 {
		step.Add = append(step.Add, Msg{Role: "assistant", Parts: []Part{{Text: g.words(g.answer)}}})
		g.answer = 0
	}
	user := Msg{Role: "user", Human: true, Parts: []Part{{Text: fmt.Sprintf("Task %d: %s", t+1, g.words(tokens))}}}
	for _, im := range pasted {
		user.Parts = append(user.Parts, g.attach(im))
	}
	step.Add = append(step.Add, user)
	w.Steps = append(w.Steps, step)
}

func (g *gen) toolLoop(w *Workload, rounds int) {
	for range rounds {
		g.calls++
		id := fmt.Sprintf("toolu_%04d", g.calls)
		var im *Image
		if g.last != nil && g.rng.Float64() < g.p.Same {
			im = g.last // the action changed nothing on screen
		} else {
			im = g.image("tool")
		}
		w.Steps = append(w.Steps, Step{Think: g.p.Think, Add: []Msg{
			{Role: "assistant", Parts: []Part{{Text: g.words(30)}, {Call: &Call{ID: id, Name: "screenshot", Input: `{}`}}}},
			{Role: "user", Parts: []Part{{Result: &Result{CallID: id, Parts: []Part{{Text: "Screenshot taken. " + g.words(25)}, g.attach(im)}}}}},
		}})
	}
	g.answer = 120
}

// codingLoop is a coding agent's tool rounds: file reads and searches
// with long text results, one of them a screenshot when shot.
func (g *gen) codingLoop(w *Workload, rounds int, shot bool) {
	for r := range rounds {
		g.calls++
		id := fmt.Sprintf("toolu_%04d", g.calls)
		name, input := "read_file", fmt.Sprintf(`{"path":"src/module_%d.go"}`, g.calls)
		result := []Part{{Text: g.words(300 + g.rng.IntN(2200))}}
		if shot && r == rounds-1 {
			name, input = "screenshot", `{}`
			result = []Part{{Text: "Screenshot of the running app."}, g.attach(g.image("tool"))}
		}
		w.Steps = append(w.Steps, Step{Think: g.p.Think, Add: []Msg{
			{Role: "assistant", Parts: []Part{{Text: g.words(80)}, {Call: &Call{ID: id, Name: name, Input: input}}}},
			{Role: "user", Parts: []Part{{Result: &Result{CallID: id, Parts: result}}}},
		}})
	}
	g.answer = 600
}

// pdf makes a document of pages pages of text, uncompressed, as a
// spec or a paper attached to a turn is.
func (g *gen) pdf(pages int) *Image {
	var b bytes.Buffer
	var offsets []int
	obj := func(body string) {
		offsets = append(offsets, b.Len())
		fmt.Fprintf(&b, "%d 0 obj\n%s\nendobj\n", len(offsets), body)
	}
	b.WriteString("%PDF-1.4\n")
	kids := make([]string, pages)
	for i := range pages {
		kids[i] = fmt.Sprintf("%d 0 R", 3+2*i)
	}
	obj("<< /Type /Catalog /Pages 2 0 R >>")
	obj(fmt.Sprintf("<< /Type /Pages /Kids [%s] /Count %d >>", strings.Join(kids, " "), pages))
	for i := range pages {
		obj(fmt.Sprintf("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>", 4+2*i))
		text := "BT /F1 11 Tf 72 720 Td (" + g.words(350) + ") Tj ET"
		obj(fmt.Sprintf("<< /Length %d >>\nstream\n%s\nendstream", len(text), text))
	}
	xref := b.Len()
	fmt.Fprintf(&b, "xref\n0 %d\n0000000000 65535 f \n", len(offsets)+1)
	for _, o := range offsets {
		fmt.Fprintf(&b, "%010d 00000 n \n", o)
	}
	fmt.Fprintf(&b, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(offsets)+1, xref)
	im := &Image{ID: len(g.images) + 1, Bytes: b.Len(), B64: base64.StdEncoding.EncodeToString(b.Bytes()), MediaType: "application/pdf", Origin: "user", Pages: pages}
	g.images = append(g.images, im)
	return im
}

func (g *gen) attach(im *Image) Part {
	g.occ++
	g.occBytes += int64(im.Bytes)
	return Part{Image: im}
}

// image makes the next distinct image: a grey PNG whose bands depend on
// its ID, with ImageKB of noise so its bytes are realistic when asked.
func (g *gen) image(origin string) *Image {
	id := len(g.images) + 1
	w, h := g.p.Width, g.p.Height
	if origin == "user" && w == 1280 {
		w, h = 1600, 1200
	}
	img := image.NewGray(image.Rect(0, 0, w, h))
	for y := range h {
		v := byte((y/16)*7 + id*13)
		for x := range w {
			img.Pix[y*w+x] = v + byte(x/64)
		}
	}
	for i := range g.p.ImageKB * 1024 {
		if i < len(img.Pix) {
			img.Pix[i] = byte(g.rng.Uint32())
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	enc.Encode(&buf, img)
	im := &Image{ID: id, W: w, H: h, Bytes: buf.Len(), B64: base64.StdEncoding.EncodeToString(buf.Bytes()), Origin: origin}
	g.images = append(g.images, im)
	g.last = im
	return im
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x1c7)) }
