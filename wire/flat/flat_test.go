package flat

import (
	"testing"

	"github.com/imgctx/imgctx/wire"
)

// A backend's answer is read with its numbers, or refused.
func TestRead(t *testing.T) {
	for _, c := range []struct {
		d    *wire.Dialect
		body string
		want wire.Completion
	}{
		{LlamaCpp, `{"content":"Done.","stop":true,"stop_type":"limit","tokens_evaluated":9,"tokens_predicted":3}`, wire.Completion{Text: "Done.", Cut: true, Prompt: 9, Output: 3}},
		{Ollama, `{"response":"Done.","done":true,"done_reason":"stop","prompt_eval_count":9,"eval_count":3}`, wire.Completion{Text: "Done.", Prompt: 9, Output: 3}},
	} {
		got, err := c.d.Flat.Read([]byte(c.body))
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.d.Name, got, err, c.want)
		}
		if _, err := c.d.Flat.Read([]byte(`<html>`)); err == nil {
			t.Errorf("%s: an HTML page was read as an answer", c.d.Name)
		}
	}
}

// FuzzRead: a flat backend's answer, whatever it is, is read or refused,
// never a panic.
//
//	go test ./wire/flat -run XXX -fuzz FuzzRead -fuzztime 60s
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"content":"Done.","stop":true,"stop_type":"limit","tokens_evaluated":9,"tokens_predicted":3}`))
	f.Add([]byte(`{"response":"Done.","done":true,"done_reason":"length","prompt_eval_count":9,"eval_count":3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, d := range []*wire.Dialect{LlamaCpp, Ollama} {
			if c, err := d.Flat.Read(b); err != nil && c != (wire.Completion{}) {
				t.Fatalf("%s: a refusal with an answer: %+v", d.Name, c)
			}
		}
	})
}
