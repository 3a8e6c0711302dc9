// Package upstream sends requests to a model server in the server's own
// wire format (Wires: OpenAI Chat Completions, Anthropic Messages, Gemini,
// llama.cpp, Ollama), retrying what a retry can cure (429, 5xx, 529,
// connection failures) with exponential backoff that honours Retry-After,
// and never a 4xx that would fail again.
package upstream

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/flat"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// Format names a wire format.
type Format string

const (
	OpenAI    Format = "openai"    // /v1/chat/completions: OpenAI, llama.cpp server, vLLM, Ollama, LM Studio
	Anthropic Format = "anthropic" // /v1/messages
	Gemini    Format = "gemini"    // /v1beta/models/{model}:generateContent (drop-in routes only)
	// Flat image-list backends: one prompt string and one list of images
	// (drop-in chat and messages routes only).
	LlamaCpp Format = "llamacpp" // llama.cpp server's /completion
	Ollama   Format = "ollama"   // Ollama's /api/generate
)

// Flat reports whether the format takes one prompt and one image list.
func (f Format) Flat() bool {
	d, ok := Wires[f]
	return ok && d.Flat != nil
}

// Client talks to one upstream. Zero fields take the defaults. Safe for
// concurrent use.
type Client struct {
	Format  Format
	BaseURL string // e.g. https://api.openai.com or http://127.0.0.1:8080; "/v1/…" is appended
	APIKey  string
	HTTP    *http.Client // default: 10 min timeout, for long streamed completions
	// MaxRetries after the first attempt; default 2. Negative: none.
	MaxRetries int
	// Backoff is the first wait; it doubles up to MaxBackoff. Defaults 500 ms, 8 s.
	Backoff, MaxBackoff time.Duration
	// Sleep waits between attempts; tests replace it. Default: a timer that
	// honours ctx.
	Sleep func(ctx context.Context, d time.Duration) error
	// Attempted, when set, sees every attempt's outcome (retries too), for
	// counts and logs.
	Attempted func(resp *http.Response, err error)
}

// MaxErrorBody bounds how much of an error response is read.
const MaxErrorBody = 1 << 20

// Wires is the one table of the formats an upstream speaks: each wire
// package's Dialect says its path, default headers, credentials, error
// shape and everything else imgctx needs of it. Adding a wire is its
// package and a line here.
var Wires = map[Format]*wire.Dialect{
	OpenAI:    openai.Dialect,
	Anthropic: anthropic.Dialect,
	Gemini:    gemini.Dialect,
	LlamaCpp:  flat.LlamaCpp,
	Ollama:    flat.Ollama,
}

// FilesAPIs are the Files APIs by the name of the client wire whose
// requests name files (a file of the Responses route lives at an OpenAI
// upstream): how a file is deleted with nothing but its record.
var FilesAPIs = map[string]*wire.Files{
	anthropic.Wire: anthropic.Files,
	responses.Wire: responses.Files,
	gemini.Wire:    gemini.Files,
}

// Wire is the client's format's Dialect (OpenAI's for an unknown one).
func (c *Client) Wire() *wire.Dialect {
	if d, ok := Wires[c.Format]; ok {
		return d
	}
	return openai.Dialect
}

func (c *Client) path() string { return c.Wire().Path }

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// defaultHTTP is the client of a Client with none: 10 minutes for long
// streamed completions.
var defaultHTTP = &http.Client{Timeout: 10 * time.Minute, Transport: NewTransport()}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// DecodeError classifies an error response in the client's format.
func (c *Client) DecodeError(status int, h http.Header, body []byte) *wire.Error {
	return c.Wire().DecodeError(status, h, body)
}

// Request is one call to the upstream as a proxy makes it: a path other
// than the format's own (count_tokens, models), the client's query string
// and headers, and a key that replaces the configured one.
type Request struct {
	Method string // default POST
	Path   string // default the format's chat path
	Query  string // the raw query, "" for none
	Header http.Header
	APIKey string // "" : the client's own credentials as forwarded in Header, unless the Client has a key
	Body   wire.Body
	// Early, when set, is this request already on its way with the
	// client's bytes (Client.Start): the first attempt finishes it when
	// Body is those bytes as they are, and abandons it otherwise.
	Early *Early
}

// Do sends body and returns the successful response, its body open for the
// caller to read (a stream, or JSON) and close. Failures come back as a
// *wire.Error (an HTTP error, classified) or a transport error. header may
// add or override request headers (a client's own key, say).
func (c *Client) Do(ctx context.Context, body []byte, header http.Header) (*http.Response, error) {
	return c.DoBody(ctx, wire.BodyOf(body), header)
}

// DoBody is Do for a body held as pieces (wire.Body), streamed to the
// upstream without being assembled; each attempt reads it anew.
func (c *Client) DoBody(ctx context.Context, body wire.Body, header http.Header) (*http.Response, error) {
	return c.Send(ctx, Request{Header: header, Body: body})
}

// Send makes the call r, retrying as Do does.
func (c *Client) Send(ctx context.Context, r Request) (*http.Response, error) {
	retries := c.MaxRetries
	if retries == 0 {
		retries = 2
	}
	backoff, maxBackoff := c.Backoff, c.MaxBackoff
	if backoff <= 0 {
		backoff = 500 * time.Millisecond
	}
	if maxBackoff <= 0 {
		maxBackoff = 8 * time.Second
	}
	wait := c.Sleep
	if wait == nil {
		wait = sleep
	}
	for attempt := 0; ; attempt++ {
		var resp *http.Response
		var err error
		if attempt == 0 && r.Early.take(r) {
			resp, err = c.result(r.Early.wait())
		} else {
			resp, err = c.once(ctx, r)
		}
		if c.Attempted != nil {
			c.Attempted(resp, err)
		}
		if err == nil {
			return resp, nil
		}
		var we *wire.Error
		retryable := errors.As(err, &we) && we.Retryable() || !errors.As(err, &we) && ctx.Err() == nil
		if !retryable || attempt >= retries {
			return nil, err
		}
		d := min(backoff<<attempt, maxBackoff)
		d = d/2 + rand.N(d/2+1) // jitter
		if we != nil && we.RetryAfter > d {
			d = min(we.RetryAfter, 60*time.Second)
		}
		if err := wait(ctx, d); err != nil {
			return nil, err
		}
	}
}

func (c *Client) once(ctx context.Context, r Request) (*http.Response, error) {
	var rd io.ReadCloser
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		rd = bodyReader(r.Body) // the transport closes it, even on errors
	}
	req, err := c.request(ctx, r, rd, int64(r.Body.Len()))
	if err != nil {
		return nil, err
	}
	if rd != nil {
		req.GetBody = func() (io.ReadCloser, error) { return bodyReader(r.Body), nil }
	}
	return c.result(c.httpClient().Do(req))
}

// smallBody is the largest body sent as a copy (bodyReader): with the
// request's headers it fits the transport's 4 KB write buffer.
const smallBody = 2 << 10

// bodyReader is what the transport reads a request's body from. A small
// body goes as a copy in a bytes.Reader: net/http writes the headers and
// such a body in one write, where for any other reader it flushes the
// headers first — a second write, and a second wake of the upstream, on
// every small request. A larger one goes from its own pieces, in vectored
// writes (NewTransport); through the 4 KB buffer it would take a write a
// buffer.
func bodyReader(b wire.Body) io.ReadCloser {
	if b.Len() > smallBody {
		return b.ReadCloser()
	}
	buf := make([]byte, b.Len())
	io.ReadFull(b.Reader(), buf) // in memory: it cannot fail
	return io.NopCloser(bytes.NewReader(buf))
}

// request is the HTTP request r makes with the body rd of n bytes (nil:
// none); it closes rd when it cannot make one.
func (c *Client) request(ctx context.Context, r Request, rd io.ReadCloser, n int64) (*http.Request, error) {
	method, path := cmp.Or(r.Method, http.MethodPost), cmp.Or(r.Path, c.path())
	u := strings.TrimRight(c.BaseURL, "/") + path
	if r.Query != "" {
		u += "?" + r.Query
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		if rd != nil {
			rd.Close()
		}
		return nil, err
	}
	for k, vs := range r.Header {
		req.Header[k] = vs
	}
	if rd != nil {
		req.ContentLength = n
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req, r)
	return req, nil
}

// result is an attempt's outcome: a 2xx response, its body open, or the
// upstream's error read and classified.
func (c *Client) result(resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	we := c.DecodeError(resp.StatusCode, resp.Header, b)
	we.Header = resp.Header
	return nil, we
}

// credentialHeaders are the headers a client's credentials travel in.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key"}

// Credential is what authenticates r at this upstream: the configured key,
// or the client's own (its credential headers and a "key" query
// parameter). "" when there is none.
func (c *Client) Credential(r Request) string {
	if key := cmp.Or(r.APIKey, c.APIKey); key != "" {
		return "key " + key
	}
	var b strings.Builder
	for _, h := range credentialHeaders {
		for _, v := range r.Header.Values(h) {
			b.WriteString(h + ": " + v + "\n")
		}
	}
	if q, err := url.ParseQuery(r.Query); err == nil && q.Has("key") {
		b.WriteString("key=" + q.Get("key") + "\n")
	}
	return b.String()
}

// Fingerprint names a credential without holding it: a SHA-256 of the
// upstream's address and the credential, never reversed (keys are long
// and random), so what is stored with a provider's file says whose it is.
func (c *Client) Fingerprint(credential string) string {
	sum := sha256.Sum256([]byte(strings.TrimRight(c.BaseURL, "/") + "\n" + credential))
	return hex.EncodeToString(sum[:16])
}

// authorize sets the wire's default headers the request lacks, and a
// configured key (r's, else the client's) in place of whatever
// credentials the client sent.
func (c *Client) authorize(req *http.Request, r Request) {
	for k, v := range c.Wire().Headers {
		if req.Header.Get(k) == "" {
			req.Header.Set(k, v)
		}
	}
	if key := cmp.Or(r.APIKey, c.APIKey); key != "" {
		for _, h := range credentialHeaders {
			req.Header.Del(h)
		}
		c.Wire().Credentials(req, key)
	}
}

// FileCall is a wire.Call to this upstream's Files API with r's
// credentials, sent once — an upload that fails falls back to base64,
// which needs no retry. Only the credentials (and the wire's own headers,
// Anthropic's version) are kept, since a call may be held to delete a
// file later: not the client's other headers, nor its body.
func (c *Client) FileCall(r Request) wire.Call {
	held := http.Header{}
	for _, h := range credentialHeaders {
		if vs := r.Header.Values(h); len(vs) > 0 {
			held[h] = slices.Clone(vs)
		}
	}
	for k := range c.Wire().Headers {
		if v := r.Header.Get(k); v != "" {
			held.Set(k, v)
		}
	}
	query := ""
	if q, err := url.ParseQuery(r.Query); err == nil && q.Has("key") {
		query = "?" + url.Values{"key": {q.Get("key")}}.Encode() // Gemini's key in the query
	}
	auth := Request{APIKey: r.APIKey}
	return func(ctx context.Context, f wire.FileRequest) (int, http.Header, []byte, error) {
		u := f.URL // an address the provider gave, with what it needs
		if u == "" {
			u = strings.TrimRight(c.BaseURL, "/") + f.Path + query
		}
		var body io.Reader
		if f.Body != nil {
			body = bytes.NewReader(f.Body)
		}
		req, err := http.NewRequestWithContext(ctx, cmp.Or(f.Method, http.MethodPost), u, body)
		if err != nil {
			return 0, nil, nil, err
		}
		req.Header = held.Clone()
		for k, vs := range f.Header {
			req.Header[http.CanonicalHeaderKey(k)] = vs
		}
		if f.ContentType != "" {
			req.Header.Set("Content-Type", f.ContentType)
		}
		c.authorize(req, auth)
		resp, err := c.httpClient().Do(req)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("upstream files API: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
		return resp.StatusCode, resp.Header, b, err
	}
}
