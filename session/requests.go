package session

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/reason"
)

// Request is one line of the request log: what one request to the
// gateway sent upstream, what it cost and what became of its images. It
// never holds message text.
type Request struct {
	ID string `json:"id"`
	// UpstreamID is the provider's own id of the request, when it gave one.
	UpstreamID string    `json:"upstream_id,omitempty"`
	Time       time.Time `json:"time"`
	Tenant     string    `json:"tenant"`
	// Conversation is a proxied conversation's key or a session's id.
	Conversation string `json:"conversation,omitempty"`
	Route        string `json:"route"`
	Wire         string `json:"wire,omitempty"`
	Model        string `json:"model,omitempty"`
	// Profile is the model profile that priced it.
	Profile    string  `json:"profile,omitempty"`
	Upstream   string  `json:"upstream,omitempty"`
	Status     int     `json:"status"`
	DurationMS float64 `json:"duration_ms"`
	// GatewayMS is imgctx's own time before the upstream was called.
	GatewayMS float64 `json:"gateway_ms,omitempty"`
	// FirstByteMS is the time to the answer's first byte; 0 when none came.
	FirstByteMS float64 `json:"first_byte_ms,omitempty"`
	// Tokens are the provider's usage: input is every prompt token, cache
	// read and write are parts of it.
	Input      int `json:"input_tokens"`
	CacheRead  int `json:"cache_read_tokens"`
	CacheWrite int `json:"cache_write_tokens"`
	Output     int `json:"output_tokens"`
	// Dollars is the usage at the model's list prices; Priced is false when
	// its profile has none (or the upstream reported no usage).
	Dollars  float64 `json:"dollars"`
	Priced   bool    `json:"priced"`
	BytesIn  int64   `json:"bytes_in"`
	BytesOut int64   `json:"bytes_out"`
	// Window is the model's context window, for the share the prompt used.
	Window int `json:"window,omitempty"`
	// Images are the request's images as it sent them: each one sent, or
	// not sent with its reason.
	Images []ImageFate `json:"images,omitempty"`
	// Outline is the conversation as sent with its text folded: the
	// messages from OutlineFrom on (those before are the previous line's
	// of the conversation), each its role and the bytes of its text. A
	// request's whole view is rebuilt from its conversation's lines.
	OutlineFrom int      `json:"outline_from,omitempty"`
	Outline     []Folded `json:"outline,omitempty"`
	// Removed counts the images this request removed for the first time:
	// the ones that changed what the provider had cached.
	Removed int `json:"removed,omitempty"`
	// Break says the provider read less of its cache than the previous
	// request left there; BreakCause is "image" (this request removed
	// images), "expired" (idle past the cache's lifetime) or "other".
	Break      bool   `json:"prefix_break,omitempty"`
	BreakCause string `json:"break_cause,omitempty"`
	Replays    int    `json:"replays,omitempty"`
	Error      string `json:"error,omitempty"`
}

// ImageFate is one image occurrence of a request: sent, or replaced by a
// marker with the reason.
type ImageFate struct {
	Ref  blob.Ref `json:"ref"`
	Msg  int      `json:"msg"` // the message it is in
	Sent bool     `json:"sent"`
	// Keep is how a tool image sent is held: kept (its measured cost in
	// the history), trial (until measured), ephemeral (this turn only);
	// empty for the user's own images.
	Keep   string      `json:"keep,omitempty"`
	Reason reason.Code `json:"reason,omitempty"`
	// Caption is what its marker says of it, when not sent.
	Caption string `json:"caption,omitempty"`
	Width   int    `json:"width,omitempty"`
	Height  int    `json:"height,omitempty"`
	// Tokens is what it costs as sent: measured when the engine measured
	// it, else the profile's estimate.
	Tokens int `json:"tokens,omitempty"`
}

// Folded is one message of a request's outline.
type Folded struct {
	Role  string `json:"role"`
	Bytes int    `json:"bytes"` // its text and framing, inline image data left out
}

// View rebuilds the outline of lines[last] from its conversation's lines,
// oldest first: each line's outline replaces the messages from its
// OutlineFrom on. ok is false when a line it needs is missing (trimmed,
// or dropped).
func View(lines []Request, last int) (view []Folded, ok bool) {
	ok = true
	for _, l := range lines[:last+1] {
		if l.OutlineFrom > len(view) {
			ok = false
			view = append(view, make([]Folded, l.OutlineFrom-len(view))...)
		}
		view = append(view[:l.OutlineFrom], l.Outline...)
	}
	return view, ok
}

// RequestFilter selects request log lines, always within one tenant.
// Empty fields select everything; Limit bounds the answer (at most
// MaxRequestList, the newest first).
type RequestFilter struct {
	Tenant       string
	ID           string // the request's id or the provider's
	Conversation string
	Model        string
	Since        time.Time
	Limit        int
}

// MaxRequestList bounds what ListRequests returns.
const MaxRequestList = 1000

// Limited is the filter's limit, within MaxRequestList.
func (f RequestFilter) Limited() int {
	if f.Limit <= 0 || f.Limit > MaxRequestList {
		return MaxRequestList
	}
	return f.Limit
}

// Matches reports whether r is selected by f (the in-memory store's query).
func (f RequestFilter) Matches(r Request) bool {
	return r.Tenant == f.Tenant && (f.ID == "" || r.ID == f.ID || r.UpstreamID == f.ID) &&
		(f.Conversation == "" || r.Conversation == f.Conversation) && (f.Model == "" || r.Model == f.Model) &&
		!r.Time.Before(f.Since)
}

// EncodeRequest writes a request log line as JSON, its time in UTC.
func EncodeRequest(r Request) ([]byte, error) {
	r.Time = time.Unix(0, r.Time.UnixNano()).UTC()
	b, err := appendRequest(make([]byte, 0, 512), &r)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeRequest reads what EncodeRequest wrote.
func DecodeRequest(b []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(b, &r); err != nil {
		return Request{}, fmt.Errorf("decode request log line: %w", err)
	}
	return r, nil
}

// LoadRequests reads a SQL store's request rows (the line's JSON, in
// order).
func LoadRequests(rows Rows) ([]Request, error) {
	return loadJSONRows(rows, "list requests", DecodeRequest)
}

// Where is the filter as a SQL condition on the requests table, its
// arguments numbered by ph (SQLite's "?" or PostgreSQL's "$n"), and the
// limit last.
func (f RequestFilter) Where(ph func(n int) string) (string, []any) {
	args := []any{f.Tenant}
	cond := "tenant = " + ph(1)
	add := func(clause string, v any) {
		args = append(args, v)
		cond += " AND " + fmt.Sprintf(clause, ph(len(args)))
	}
	if f.ID != "" {
		args = append(args, f.ID, f.ID)
		cond += fmt.Sprintf(" AND (id = %s OR upstream_id = %s)", ph(len(args)-1), ph(len(args)))
	}
	if f.Conversation != "" {
		add("conversation = %s", f.Conversation)
	}
	if f.Model != "" {
		add("model = %s", f.Model)
	}
	if !f.Since.IsZero() {
		add("at >= %s", f.Since.UnixNano())
	}
	args = append(args, f.Limited())
	return cond + " ORDER BY seq DESC LIMIT " + ph(len(args)), args
}

// Totals sums the request log's lines of one model in one hour.
type Totals struct {
	Model                                          string
	Hour                                           time.Time // its start, UTC
	Requests, Input, CacheRead, CacheWrite, Output int64
	Dollars                                        float64
	Sent, NotSent, Breaks                          int64
}

// Counted are the numbers of a line the stores sum: images sent and not
// sent, and 1 for a prefix break.
func (r Request) Counted() (sent, notSent, brk int) {
	for _, img := range r.Images {
		if img.Sent {
			sent++
		} else {
			notSent++
		}
	}
	if r.Break {
		brk = 1
	}
	return sent, notSent, brk
}

// SumSQL is the query both SQL stores sum the log with, by model and hour,
// its placeholders numbered by ph (tenant, since).
func SumSQL(ph func(n int) string) string {
	return `SELECT model, at / 3600000000000, count(*), sum(input), sum(cache_read), sum(cache_write), sum(output), sum(dollars),
		sum(sent), sum(not_sent), sum(brk) FROM requests WHERE tenant = ` + ph(1) + ` AND at >= ` + ph(2) + `
		GROUP BY model, at / 3600000000000 ORDER BY 2, 1`
}

// LoadTotals reads SumSQL's rows.
func LoadTotals(rows Rows) ([]Totals, error) {
	var out []Totals
	for rows.Next() {
		var t Totals
		var hour int64
		if err := rows.Scan(&t.Model, &hour, &t.Requests, &t.Input, &t.CacheRead, &t.CacheWrite, &t.Output, &t.Dollars, &t.Sent, &t.NotSent, &t.Breaks); err != nil {
			return nil, fmt.Errorf("sum requests: %w", err)
		}
		t.Hour = time.Unix(hour*3600, 0).UTC()
		out = append(out, t)
	}
	return out, rows.Err()
}

// Add counts a line into its model's and hour's totals (the in-memory
// store's sum).
func (t *Totals) Add(r Request) {
	sent, notSent, brk := r.Counted()
	t.Requests++
	t.Input, t.CacheRead, t.CacheWrite, t.Output = t.Input+int64(r.Input), t.CacheRead+int64(r.CacheRead), t.CacheWrite+int64(r.CacheWrite), t.Output+int64(r.Output)
	t.Dollars += r.Dollars
	t.Sent, t.NotSent, t.Breaks = t.Sent+int64(sent), t.NotSent+int64(notSent), t.Breaks+int64(brk)
}
