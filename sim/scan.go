package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// seen is one message of the previous request: its bytes and its blocks.
// A re-sent history is mostly the same messages at the same places, so
// they are recognised by a memory compare, not parsed or hashed again:
// real screenshot sizes (tens of MB a request) cost what copying them does.
type seen struct {
	raw    []byte
	blocks []block
}

// blocks reads a request body into its cacheable blocks, in the
// provider's prefix order: tools, system, then the messages (contents).
func (p *Provider) blocks(api string, body []byte) ([]block, error) {
	list, sysKey := listOf(api), "system"
	switch api {
	case "gemini":
		sysKey = "systemInstruction"
	case "responses":
		sysKey = "instructions"
	}
	var tools, system []byte
	var msgs []block
	found := false
	i := jsonspan.Skip(body, 0)
	end, err := jsonspan.Object(body, i, func(key []byte, vs int) (int, error) {
		switch string(key) {
		case list:
			found = true
			if body[vs] == '"' { // Responses: the input as one user message
				ve, err := jsonspan.End(body, vs)
				if err == nil {
					raw := body[vs:ve]
					msgs = []block{p.textBlock("user", raw, func() string { return unquote(raw) })}
				}
				return ve, err
			}
			ve, bs, err := p.elements(api, body, vs)
			msgs = bs
			return ve, err
		case "tools", sysKey:
			ve, err := jsonspan.End(body, vs)
			if err == nil && string(key) == "tools" {
				tools = body[vs:ve]
			} else if err == nil {
				system = body[vs:ve]
			}
			return ve, err
		}
		return jsonspan.End(body, vs)
	})
	if err != nil {
		return nil, err
	}
	if jsonspan.Skip(body, end) != len(body) {
		return nil, fmt.Errorf("unexpected data after the request object")
	}
	if !found {
		return nil, fmt.Errorf("%s: field required", list)
	}
	var out []block
	if len(tools) > 0 && string(tools) != "null" {
		out = append(out, p.textBlock("tools", tools, func() string { return string(tools) }))
	}
	if len(system) > 0 && string(system) != "null" {
		bs, err := p.systemBlocks(api, system)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", sysKey, err)
		}
		out = append(out, bs...)
	}
	out = append(out, msgs...)
	if api == "anthropic" {
		bps := 0
		var shortest time.Duration
		for _, b := range out {
			if !b.bp {
				continue
			}
			bps++
			if shortest > 0 && b.ttl > shortest {
				// The documented rule: longer lifetimes before shorter ones.
				return nil, fmt.Errorf("a cache_control ttl of %s follows one of %s: longer TTLs must come before shorter ones", b.ttl, shortest)
			}
			if shortest == 0 || b.ttl < shortest {
				shortest = b.ttl
			}
		}
		if bps > 4 {
			//lint:ignore ST1005 the provider's own wording, which agents match on
			return nil, fmt.Errorf("A maximum of 4 blocks with cache_control may be provided. Found %d.", bps)
		}
	}
	return out, nil
}

// listOf names the member holding a wire's conversation.
func listOf(api string) string {
	switch api {
	case "gemini":
		return "contents"
	case "responses":
		return "input"
	}
	return "messages"
}

func (p *Provider) systemBlocks(api string, raw []byte) ([]block, error) {
	if raw[0] == '"' {
		return []block{p.textBlock("system", raw, func() string { return unquote(raw) })}, nil
	}
	if api == "gemini" {
		b, err := p.geminiContent("system", elide(raw))
		return []block{b}, err
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, err
	}
	var out []block
	for _, part := range parts {
		b, err := p.anthropicBlock("system", part, elided{})
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// elements reads the array of messages at b[vs]: a message the previous
// request had at the same index, byte for byte, keeps its blocks.
func (p *Provider) elements(api string, b []byte, vs int) (int, []block, error) {
	prev := p.prev
	var next []seen
	var out []block
	end, err := jsonspan.Array(b, vs, func(es int) (int, error) {
		k := len(next)
		if k < len(prev) && bytes.HasPrefix(b[es:], prev[k].raw) {
			// A JSON object ends where its bytes do: these are that message.
			next = append(next, seen{raw: b[es : es+len(prev[k].raw)], blocks: prev[k].blocks})
			out = append(out, prev[k].blocks...)
			return es + len(prev[k].raw), nil
		}
		ee, err := jsonspan.End(b, es)
		if err != nil {
			return ee, err
		}
		raw := b[es:ee]
		bs, err := p.message(api, raw, func() ([]block, error) { return p.readMessage(api, raw) })
		if err != nil {
			return ee, fmt.Errorf("%s.%d: %v", listOf(api), k, err)
		}
		next = append(next, seen{raw: raw, blocks: bs})
		out = append(out, bs...)
		return ee, nil
	})
	if err == nil {
		p.prev = next
	}
	return end, out, err
}

func (p *Provider) readMessage(api string, raw []byte) ([]block, error) {
	e := elide(raw)
	switch api {
	case "anthropic":
		return p.anthropicMessage(e)
	case "gemini":
		b, err := p.geminiContent("", e)
		return []block{b}, err
	case "responses":
		b, err := p.responsesItem(e)
		return []block{b}, err
	}
	h := hashOf("message", e.small)
	b := block{hash: h, images: strings.Count(string(e.small), `"type":"image_url"`)}
	n, err := p.openaiTokens(e, &b)
	b.tokens = n + messageFraming
	return []block{b}, err
}

// geminiContent reads one Gemini content (role and parts) as one block:
// text, inlineData images and PDFs, function calls and responses.
func (p *Provider) geminiContent(role string, e elided) (block, error) {
	raw := e.small
	var c struct {
		Role  string `json:"role"`
		Parts []struct {
			Text       *string `json:"text"`
			InlineData *struct {
				MimeType string `json:"mimeType"`
				Data     string `json:"data"`
			} `json:"inlineData"`
			FileData *struct {
				MimeType string `json:"mimeType"`
				URI      string `json:"fileUri"`
			} `json:"fileData"`
			FunctionCall *struct {
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			} `json:"functionCall"`
			FunctionResponse *struct {
				Name     string          `json:"name"`
				Response json.RawMessage `json:"response"`
				Parts    []struct {
					InlineData *struct {
						MimeType string `json:"mimeType"`
						Data     string `json:"data"`
					} `json:"inlineData"`
				} `json:"parts"`
			} `json:"functionResponse"`
		} `json:"parts"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return block{}, err
	}
	b := block{hash: hashOf("gemini"+role, raw), tokens: messageFraming}
	inline := func(mime, data string) error {
		switch {
		case mime == "application/pdf":
			n, err := p.pdfTokens(e.resolve(data), &b)
			b.tokens += n
			return err
		case strings.HasPrefix(mime, "image/"):
			n, err := p.imageTokens(data, "", 0, &b, e)
			b.images++
			b.tokens += n
			return err
		}
		return fmt.Errorf("inlineData: unsupported MIME type %q", mime)
	}
	for _, part := range c.Parts {
		switch {
		case part.Text != nil:
			b.tokens += p.text(*part.Text)
		case part.InlineData != nil:
			if err := inline(part.InlineData.MimeType, part.InlineData.Data); err != nil {
				return block{}, err
			}
		case part.FileData != nil:
			if data, ok := p.files[part.FileData.URI[strings.LastIndexByte(part.FileData.URI, '/')+1:]]; ok {
				if err := inline(part.FileData.MimeType, data); err != nil {
					return block{}, err
				}
				continue
			}
			b.images++ // a file the emulator does not have (unseen)
			b.tokens += p.unseen(false, "")
		case part.FunctionCall != nil:
			b.tokens += p.text(part.FunctionCall.Name) + p.text(string(part.FunctionCall.Args))
		case part.FunctionResponse != nil:
			b.tokens += p.text(part.FunctionResponse.Name) + p.text(string(part.FunctionResponse.Response))
			for _, in := range part.FunctionResponse.Parts {
				if in.InlineData != nil {
					if err := inline(in.InlineData.MimeType, in.InlineData.Data); err != nil {
						return block{}, err
					}
				}
			}
		}
	}
	return b, nil
}

// pdfPage finds the page objects and shown text of a PDF, as far as the
// emulator needs them: the simulator's own documents are uncompressed.
var (
	pdfPage = regexp.MustCompile(`/Type\s*/Page[^s]`)
	pdfText = regexp.MustCompile(`\(((?:[^()\\]|\\.)*)\)\s*Tj`)
)

// pdfTokens prices a PDF as the providers document it: each page is its
// text plus an image of the page (Anthropic, OpenAI: a US-letter page at
// the profile's image rule); Gemini prices a page as one image.
func (p *Provider) pdfTokens(b64 string, b *block) (int, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || !bytes.HasPrefix(raw, []byte("%PDF-")) {
		return 0, fmt.Errorf("the PDF specified was not valid")
	}
	pages := len(pdfPage.FindAll(raw, -1))
	if pages == 0 {
		return 0, fmt.Errorf("the PDF specified was not valid")
	}
	b.pages += pages
	page, ok := tokens.PageTokens(p.Profile, "")
	if !ok {
		page, _ = tokens.ImageTokens(p.Profile, 816, 1056, "") // a US-letter page at 96 dpi
	}
	t := pages * page
	if !ok {
		for _, m := range pdfText.FindAllSubmatch(raw, -1) {
			t += p.text(string(m[1]))
		}
	}
	return t, nil
}

// elideOver is the length past which a base64 string (an image's or a
// PDF's data) is read from the message as its head and a reference: the
// emulator needs an image's header and its length, not its megabytes
// decoded by encoding/json at every step.
const elideOver = 8192

// elided is a message's bytes with its long base64 strings cut to their
// first elideOver bytes, followed by NUL and the hex SHA-256 of the whole
// string: the small bytes still name every byte of the message, so they
// hash and memoise as the whole would.
type elided struct {
	small []byte
	long  map[string][]byte // by hex SHA-256
}

// elide cuts the long base64 strings out of raw, a valid JSON value.
func elide(raw []byte) elided {
	var out []byte
	var long map[string][]byte
	last := 0
	for i := 0; i < len(raw); {
		j := bytes.IndexByte(raw[i:], '"')
		if j < 0 {
			break
		}
		s := i + j
		k := s + 1
		for {
			q := bytes.IndexByte(raw[k:], '"')
			if q < 0 {
				return elided{small: raw}
			}
			e, n := k+q, 0
			for raw[e-1-n] == '\\' {
				n++
			}
			k = e + 1
			if n%2 == 0 {
				k = e
				break
			}
		}
		str := raw[s+1 : k]
		if len(str) > elideOver && dataKey(raw[:s]) && bytes.IndexByte(str, '\\') < 0 {
			sum := sha256.Sum256(str)
			key := hex.EncodeToString(sum[:])
			if long == nil {
				long = map[string][]byte{}
			}
			long[key] = str
			out = append(out, raw[last:s+1+elideOver]...)
			out = append(out, `\u0000`...)
			out = append(out, key...)
			last = k
		}
		i = k + 1
	}
	if long == nil {
		return elided{small: raw}
	}
	return elided{small: append(out, raw[last:]...), long: long}
}

// dataKey reports whether the string that follows before is the value of
// a member that carries data: "data" (Anthropic, Gemini), "url" (a data
// URL), "file_data" (an OpenAI file), "image_url" (a Responses image).
func dataKey(before []byte) bool {
	before = bytes.TrimRight(before, " \t\r\n")
	if !bytes.HasSuffix(before, []byte(":")) {
		return false
	}
	before = bytes.TrimRight(before[:len(before)-1], " \t\r\n")
	for _, k := range []string{`"data"`, `"url"`, `"file_data"`, `"image_url"`} {
		if bytes.HasSuffix(before, []byte(k)) {
			return true
		}
	}
	return false
}

// resolve returns the whole string an elided one stands for.
func (e elided) resolve(s string) string {
	if i := strings.LastIndexByte(s, 0); i >= 0 {
		if l, ok := e.long[s[i+1:]]; ok {
			return string(l)
		}
	}
	return s
}

// length is the length of the whole string an elided one stands for.
func (e elided) length(s string) int {
	if i := strings.LastIndexByte(s, 0); i >= 0 {
		if l, ok := e.long[s[i+1:]]; ok {
			return len(l)
		}
	}
	return len(s)
}
