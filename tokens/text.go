package tokens

import (
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
)

// TextCounter counts the tokens of a text. Implementations are safe for
// concurrent use.
type TextCounter interface {
	Count(s string) int
}

// Base64RunMin is the length from which a run of base64-alphabet characters
// without spaces is treated as encoded binary: it is never handed to the BPE
// tokenizer (whose cost on one giant "word" grows much faster than its
// length) and is counted at Base64CharsPerToken instead.
const Base64RunMin = 256

// Base64CharsPerToken is how many base64 characters o200k and cl100k spend
// per token on random data (measured 1.47 and 1.40 by TestBase64Ratio).
const Base64CharsPerToken = 1.45

// CounterFor returns the counter named by a profile's tokenizer field:
// "o200k" or "cl100k" (offline BPE vocabularies, loaded on first use), or
// "chars4", the documented fallback of one token per four characters
// (runes). Unknown names get chars4.
func CounterFor(name string) TextCounter {
	switch name {
	case "o200k":
		return o200k
	case "cl100k":
		return cl100k
	}
	return Chars4{}
}

// Chars4 counts one token per four characters, rounding up.
type Chars4 struct{}

func (Chars4) Count(s string) int { return (utf8.RuneCountInString(s) + 3) / 4 }

// BPE counts with an OpenAI BPE vocabulary, loaded once on first use
// (about 0.1 s). Long base64 runs are counted without tokenizing them.
type BPE struct {
	enc  tokenizer.Encoding
	once sync.Once
	c    tokenizer.Codec
	err  error
}

var (
	o200k  = &BPE{enc: tokenizer.O200kBase}
	cl100k = &BPE{enc: tokenizer.Cl100kBase}
)

// Count returns the token count of s. Should the vocabulary fail to load,
// it falls back to Chars4 rather than fail a request.
func (b *BPE) Count(s string) int {
	b.once.Do(func() { b.c, b.err = tokenizerGet(b) })
	if b.err != nil {
		return Chars4{}.Count(s)
	}
	n := 0
	for len(s) > 0 {
		start, end := nextBase64Run(s)
		if start > 0 {
			k, err := b.c.Count(s[:start])
			if err != nil {
				k = Chars4{}.Count(s[:start])
			}
			n += k
		}
		if end > start {
			n += int(float64(end-start)/Base64CharsPerToken + 0.999)
		}
		s = s[end:]
	}
	return n
}

// nextBase64Run finds the first run of at least Base64RunMin base64
// characters in s. It returns (len(s), len(s)) when there is none.
func nextBase64Run(s string) (start, end int) {
	run := 0
	for i := 0; i < len(s); i++ {
		if Base64Byte(s[i]) {
			run++
			continue
		}
		if run >= Base64RunMin {
			return i - run, i
		}
		run = 0
	}
	if run >= Base64RunMin {
		return len(s) - run, len(s)
	}
	return len(s), len(s)
}

// Base64Byte reports whether c belongs to the standard or URL-safe base64
// alphabet, padding included.
func Base64Byte(c byte) bool { return b64Char[c] }

var b64Char = func() (t [256]bool) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c], t[c+'a'-'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	t['+'], t['/'], t['-'], t['_'], t['='] = true, true, true, true, true
	return t
}()

// tokenizerGet loads b's vocabulary (split out so tests can force a load).
func tokenizerGet(b *BPE) (tokenizer.Codec, error) { return tokenizer.Get(b.enc) }

// MessageFraming is what providers bill per message beyond its content (the
// role and separators: OpenAI documents 3 a message plus the reply's
// priming; Anthropic's framing is of the same size). Estimates add it, and
// a measurement subtracts it for each message appended since its base.
const MessageFraming = 4
