package tokens

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
)

func BenchmarkImageTokens(b *testing.B) {
	for _, name := range []string{"gpt-4o", "gpt-5.4", "claude-standard", "claude-high-resolution", "gemini-2", "gemini-3", "qwen2-vl"} {
		p := mustProfileB(b, name)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ImageTokens(p, 3840, 2160, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustProfileB(b *testing.B, name string) Profile {
	for _, p := range Default().Profiles {
		if p.Name == name {
			return p
		}
	}
	b.Fatalf("no profile %s", name)
	return Profile{}
}

// realText is this repository's own Go source, YAML and Markdown: code and
// prose with a real vocabulary, not one sentence repeated.
func realText(b *testing.B) string {
	var sb strings.Builder
	for _, pat := range []string{"../*/*.go", "../*.md", "../docs/*.md", "*.yaml"} {
		files, _ := filepath.Glob(pat)
		for _, f := range files {
			data, _ := os.ReadFile(f)
			sb.Write(data)
		}
	}
	if sb.Len() < 100_000 {
		b.Fatalf("only %d bytes of text found", sb.Len())
	}
	return sb.String()
}

// BenchmarkCountText reports tokens/s; the target is ≥ 1M. The chars4
// baseline is the cheapest possible counter.
func BenchmarkCountText(b *testing.B) {
	text := realText(b)
	for _, name := range []string{"o200k", "cl100k", "chars4"} {
		c := CounterFor(name)
		n := c.Count(text) // load the vocabulary outside the timing
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				c.Count(text)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
	// A 1.1 MB data URL pasted into a message: counted without the tokenizer.
	pasted := "here: data:image/png;base64," + strings.Repeat("iVBORw0KGgo", 100000) + " thanks"
	b.Run("o200k-1MB-data-url", func(b *testing.B) {
		c := CounterFor("o200k")
		for b.Loop() {
			c.Count(pasted)
		}
	})
}

// BenchmarkCharCounts is compaction's accounting over a 2,000-message
// history with 200 images; with a reused buffer it allocates nothing.
func BenchmarkCharCounts(b *testing.B) {
	msgs := make([]chat.Message, 2000)
	for i := range msgs {
		m := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: strings.Repeat("word ", 40)}}}
		if i%10 == 0 {
			m = chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c", Name: "shot", Parts: []chat.Part{
				chat.Text{Text: "captured"}, chat.Image{Ref: blob.Of([]byte{byte(i)}), MediaType: "image/png"}}}}}
		}
		msgs[i] = m
	}
	buf := make([]int, 0, len(msgs))
	b.ReportAllocs()
	for b.Loop() {
		buf = CharCounts(buf, msgs, 0)
	}
}
