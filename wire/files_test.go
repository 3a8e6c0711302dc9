package wire

import "testing"

func TestKeyBefore(t *testing.T) {
	for _, c := range []struct {
		body  string
		at    int // offset of the value
		start int
		name  string
		ok    bool
	}{
		{`{"image_url":"x"}`, 13, 1, "image_url", true},
		{`{"image_url" : 	"x"}`, 16, 1, "image_url", true},
		{`{"image\u005furl":"x"}`, 18, 0, "", false}, // an escaped name: not taken
		{`["x"]`, 1, 0, "", false},
		{`{"a":"x"}`, 5, 1, "a", true},
		{`:"x"`, 1, 0, "", false},
	} {
		start, name, ok := KeyBefore([]byte(c.body), c.at)
		if ok != c.ok || ok && (start != c.start || name != c.name) {
			t.Errorf("%s at %d: %d %q %v, want %d %q %v", c.body, c.at, start, name, ok, c.start, c.name, c.ok)
		}
	}
}

func TestFileName(t *testing.T) {
	for mt, want := range map[string]string{"image/png": "imgctx.png", "image/webp": "imgctx.webp", "": "imgctx.bin", "image/": "imgctx.bin"} {
		if got := FileName(mt); got != want {
			t.Errorf("%q: %q, want %q", mt, got, want)
		}
	}
}

// KeyBefore reads client bytes backwards: whatever they are, it stays in
// them, and a name it finds stands quoted right before the value.
func FuzzKeyBefore(f *testing.F) {
	f.Add([]byte(`{"image_url":"x"}`), 13)
	f.Add([]byte(`{"a" : "x"}`), 7)
	f.Add([]byte(`"\"":1`), 5)
	f.Fuzz(func(t *testing.T, body []byte, at int) {
		if at < 0 || at > len(body) {
			return
		}
		start, name, ok := KeyBefore(body, at)
		if !ok {
			return
		}
		if start < 0 || start+len(name)+2 > at || body[start] != '"' || string(body[start+1:start+1+len(name)]) != name || body[start+1+len(name)] != '"' {
			t.Fatalf("%q at %d: %d %q", body, at, start, name)
		}
	})
}
