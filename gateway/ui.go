package gateway

import (
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire/openai"
)

//go:embed ui
var uiFiles embed.FS

var uiPages = template.Must(template.New("ui").Funcs(template.FuncMap{
	"dollars": func(v float64) string { return fmt.Sprintf("$%.4f", v) },
	"percent": func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) },
	"ms":      func(v float64) string { return fmt.Sprintf("%.1f ms", v) },
	"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
	"short":   short,
	"bytes": func(n int) string {
		if n >= 1<<10 {
			return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%d bytes", n)
	},
}).ParseFS(uiFiles, "ui/*.html"))

// uiRoutes serves the dashboard under /ui: server-rendered pages over the
// request log, and thumbnails of the images it names.
func (s *Server) uiRoutes(mux *http.ServeMux) {
	page := func(pattern string, h func(w http.ResponseWriter, r *http.Request, v *uiView)) {
		mux.Handle(pattern, s.wrap("ui", openai.Dialect, false, func(w http.ResponseWriter, r *http.Request, _ string) {
			v, ok := s.uiAccess(w, r)
			if !ok {
				return
			}
			h(w, r, v)
		}))
	}
	page("GET /ui", s.uiOverview)
	page("GET /ui/conversations", s.uiConversations)
	page("GET /ui/conversations/{id}", s.uiConversation)
	page("GET /ui/conversations/{id}/requests/{rid}", s.uiSaw)
	page("GET /ui/thumbs/{ref}", s.uiThumb)
	mux.Handle("GET /ui/static/style.css", s.wrap("ui", openai.Dialect, false, func(w http.ResponseWriter, r *http.Request, _ string) {
		if _, ok := s.uiAccess(w, r); !ok {
			return
		}
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=3600")
		b, _ := uiFiles.ReadFile("ui/style.css")
		w.Write(b)
	}))
}

// uiView is what every page shows: whose data, and how to keep it in links.
type uiView struct {
	Title, Tenant, Version string
	Q                      template.URL // the tenant's query (?tenant=) for an admin's links
	Tenants                []string     // an admin's choice
	Partial                bool
	Lines                  int
	O                      *uiOverview
	C                      []uiConversation
	T                      *uiTimeline
	S                      *uiSaw
}

// uiAccess decides who looks: the admin key (ui.admin_key, as the
// password of HTTP Basic auth or a Bearer token) sees every tenant, from
// anywhere; without it the dashboard answers loopback clients only — a
// request through a proxy (X-Forwarded-For, Forwarded) is not one — and,
// with auth.keys set, shows the tenant of the key given.
func (s *Server) uiAccess(w http.ResponseWriter, r *http.Request) (*uiView, bool) {
	v := &uiView{Version: s.cfg.Version, Tenant: imagestore.DefaultTenant}
	key := ""
	if _, pw, ok := r.BasicAuth(); ok {
		key = pw
	} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		key = b
	}
	if s.cfg.UIAdminKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.UIAdminKey)) == 1 {
		for _, t := range s.cfg.Keys {
			if !slices.Contains(v.Tenants, t) {
				v.Tenants = append(v.Tenants, t)
			}
		}
		slices.Sort(v.Tenants)
		if t := r.URL.Query().Get("tenant"); t != "" {
			v.Tenant = t
		} else if len(v.Tenants) > 0 {
			v.Tenant = v.Tenants[0]
		}
		v.Q = template.URL("?tenant=" + url.QueryEscape(v.Tenant))
		return v, true
	}
	if !loopbackClient(r) {
		http.Error(w, "the dashboard answers loopback clients only, or the admin key (ui.admin_key)", http.StatusForbidden)
		return nil, false
	}
	if len(s.cfg.Keys) > 0 {
		for k, tenant := range s.cfg.Keys {
			if key != "" && subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
				v.Tenant = tenant
				return v, true
			}
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="imgctx dashboard", charset="UTF-8"`)
		http.Error(w, "an API key is needed: the password of HTTP Basic auth (any user name), or Authorization: Bearer", http.StatusUnauthorized)
		return nil, false
	}
	return v, true
}

// loopbackClient reports whether the request comes from this machine and
// not through a proxy on it.
func loopbackClient(r *http.Request) bool {
	if r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("Forwarded") != "" || r.Header.Get("X-Real-Ip") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) uiRender(w http.ResponseWriter, r *http.Request, name string, v *uiView) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self'; style-src 'self' 'unsafe-inline'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := uiPages.ExecuteTemplate(w, name, v); err != nil {
		s.log.ErrorContext(r.Context(), "ui: rendering", "page", name, "err", err)
	}
}

// uiLines reads the tenant's newest lines (one conversation's when conv
// is set), oldest first.
func (s *Server) uiLines(r *http.Request, v *uiView, conv string) ([]session.Request, error) {
	if s.reqlog != nil {
		s.reqlog.Flush()
	}
	rs, err := s.engine.Sessions.ListRequests(r.Context(), session.RequestFilter{Tenant: v.Tenant, Conversation: conv})
	slices.Reverse(rs)
	v.Lines, v.Partial = len(rs), len(rs) >= session.MaxRequestList
	return rs, err
}

type uiCount struct {
	Name string
	N    int
}

type uiModel struct {
	Name                                   string
	Requests, Input, CacheRead, CacheWrite int
	Output                                 int
	Dollars                                float64
}

type uiHour struct {
	Name     string
	Requests int
	Dollars  float64
	Width    int
}

type uiOverview struct {
	Requests, Sent, NotSentTotal, Breaks int
	Dollars, HitRate                     float64
	Models                               []*uiModel
	Reasons, Causes                      []uiCount
	Hours                                []*uiHour
}

func counted(m map[string]int) []uiCount {
	var out []uiCount
	for k, n := range m {
		out = append(out, uiCount{k, n})
	}
	slices.SortFunc(out, func(a, b uiCount) int { return b.N - a.N })
	return out
}

// uiOverview sums the tenant's whole log (by model and hour, in the
// store); the reasons and causes come from its newest lines.
func (s *Server) uiOverview(w http.ResponseWriter, r *http.Request, v *uiView) {
	lines, err := s.uiLines(r, v, "")
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	totals, err := s.engine.Sessions.SumRequests(r.Context(), v.Tenant, time.Time{})
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	o := &uiOverview{}
	models, hours := map[string]*uiModel{}, map[string]*uiHour{}
	var input, read int64
	for _, t := range totals {
		o.Requests += int(t.Requests)
		o.Dollars += t.Dollars
		o.Sent, o.NotSentTotal, o.Breaks = o.Sent+int(t.Sent), o.NotSentTotal+int(t.NotSent), o.Breaks+int(t.Breaks)
		input, read = input+t.Input, read+t.CacheRead
		name := t.Model
		if name == "" {
			name = "(none)"
		}
		m := models[name]
		if m == nil {
			m = &uiModel{Name: name}
			models[name] = m
			o.Models = append(o.Models, m)
		}
		m.Requests += int(t.Requests)
		m.Input, m.CacheRead, m.CacheWrite, m.Output = m.Input+int(t.Input), m.CacheRead+int(t.CacheRead), m.CacheWrite+int(t.CacheWrite), m.Output+int(t.Output)
		m.Dollars += t.Dollars
		hk := t.Hour.Format("2006-01-02 15:00")
		h := hours[hk]
		if h == nil {
			h = &uiHour{Name: hk}
			hours[hk] = h
			o.Hours = append(o.Hours, h)
		}
		h.Requests += int(t.Requests)
		h.Dollars += t.Dollars
	}
	if input > 0 {
		o.HitRate = float64(read) / float64(input)
	}
	most := 1
	for _, h := range o.Hours {
		most = max(most, h.Requests)
	}
	for _, h := range o.Hours {
		h.Width = 100 * h.Requests / most
	}
	reasons, causes := map[string]int{}, map[string]int{}
	for _, l := range lines {
		for _, img := range l.Images {
			if !img.Sent {
				reasons[string(img.Reason)]++
			}
		}
		if l.Break {
			causes[l.BreakCause]++
		}
	}
	o.Reasons, o.Causes = counted(reasons), counted(causes)
	v.Title, v.O = "Overview", o
	s.uiRender(w, r, "overview.html", v)
}

type uiConversation struct {
	ID, Kind, Model         string
	Requests, Sent, NotSent int
	Dollars                 float64
	Last                    time.Time
}

func kindOf(l session.Request) string {
	if l.Route == "sessions_turn" {
		return "session"
	}
	return "proxied"
}

func (s *Server) uiConversations(w http.ResponseWriter, r *http.Request, v *uiView) {
	lines, err := s.uiLines(r, v, "")
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	by := map[string]*uiConversation{}
	var order []*uiConversation
	for _, l := range lines {
		if l.Conversation == "" {
			continue
		}
		c := by[l.Conversation]
		if c == nil {
			c = &uiConversation{ID: l.Conversation, Kind: kindOf(l)}
			by[l.Conversation] = c
			order = append(order, c)
		}
		c.Requests++
		c.Dollars += l.Dollars
		c.Model, c.Last = l.Model, l.Time
		c.Sent, c.NotSent, _ = l.Counted()
	}
	slices.SortFunc(order, func(a, b *uiConversation) int { return b.Last.Compare(a.Last) })
	for _, c := range order {
		v.C = append(v.C, *c)
	}
	v.Title = "Conversations"
	s.uiRender(w, r, "conversations.html", v)
}

// uiRow is one request of a conversation's timeline.
type uiRow struct {
	session.Request
	N                       int
	Duration                float64
	Cause                   string
	Text, ImageTokens, Free int
	TextPct, ImgPct         int
	New, Removed            []session.ImageFate
	Carried                 int
}

type uiTimeline struct {
	ID, Kind, Model string
	Dollars         float64
	Rows            []uiRow
}

func (s *Server) uiConversation(w http.ResponseWriter, r *http.Request, v *uiView) {
	id := r.PathValue("id")
	lines, err := s.uiLines(r, v, id)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	if len(lines) == 0 {
		http.Error(w, "no such conversation", http.StatusNotFound)
		return
	}
	t := &uiTimeline{ID: id, Kind: kindOf(lines[0])}
	seen, shown := map[blob.Ref]bool{}, map[blob.Ref]bool{}
	for i, l := range lines {
		row := uiRow{Request: l, N: i + 1, Duration: l.DurationMS, Cause: l.BreakCause}
		removedNow := map[blob.Ref]bool{}
		for _, img := range l.Images {
			switch {
			case img.Sent && !seen[img.Ref]:
				seen[img.Ref] = true
				row.New = append(row.New, img)
			case img.Sent:
				row.Carried++
			case shown[img.Ref] && !removedNow[img.Ref]:
				// Sent by an earlier request, a marker from this one on.
				removedNow[img.Ref] = true
				row.Removed = append(row.Removed, img)
			}
			if img.Sent {
				row.ImageTokens += img.Tokens
			}
		}
		// An image not sent here stops counting as shown: the next
		// request that drops it again is no new removal.
		clear(shown)
		for _, img := range l.Images {
			if img.Sent {
				shown[img.Ref] = true
			}
		}
		if l.Window > 0 {
			row.Text = max(l.Input-row.ImageTokens, 0)
			row.Free = max(l.Window-l.Input, 0)
			row.TextPct = min(100*row.Text/l.Window, 100)
			row.ImgPct = min(100*row.ImageTokens/l.Window, 100-row.TextPct)
		}
		t.Dollars += l.Dollars
		t.Model = l.Model
		t.Rows = append(t.Rows, row)
	}
	v.Title, v.T = "Conversation "+short(id), t
	s.uiRender(w, r, "conversation.html", v)
}

// short is a conversation's id as pages name it: its first 16 bytes.
func short(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

// uiSawMsg is one message as the model got it: its role, its text's size,
// and its images or their markers in place.
type uiSawMsg struct {
	Role   string
	Bytes  int
	Images []session.ImageFate
}

type uiSaw struct {
	session.Request
	N             int
	Sent, NotSent int
	Complete      bool
	Messages      []uiSawMsg
}

func (s *Server) uiSaw(w http.ResponseWriter, r *http.Request, v *uiView) {
	lines, err := s.uiLines(r, v, r.PathValue("id"))
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	at := slices.IndexFunc(lines, func(l session.Request) bool { return l.ID == r.PathValue("rid") })
	if at < 0 {
		http.Error(w, "no such request in this conversation", http.StatusNotFound)
		return
	}
	view, complete := session.View(lines, at)
	l := lines[at]
	sw := &uiSaw{Request: l, N: at + 1, Complete: complete}
	sw.Sent, sw.NotSent, _ = l.Counted()
	for _, f := range view {
		sw.Messages = append(sw.Messages, uiSawMsg{Role: f.Role, Bytes: f.Bytes})
	}
	for _, img := range l.Images {
		for img.Msg >= len(sw.Messages) {
			sw.Messages = append(sw.Messages, uiSawMsg{Role: "?"})
		}
		sw.Messages[img.Msg].Images = append(sw.Messages[img.Msg].Images, img)
	}
	v.Title, v.S = fmt.Sprintf("What the model saw at request #%d", at+1), sw
	s.uiRender(w, r, "saw.html", v)
}

// uiThumb serves a thumbnail of one of the tenant's images: another
// tenant's ref is a 404 like a missing one.
func (s *Server) uiThumb(w http.ResponseWriter, r *http.Request, v *uiView) {
	ref, err := blob.Parse(r.PathValue("ref"))
	if err != nil {
		http.Error(w, "not an image ref", http.StatusBadRequest)
		return
	}
	data, mt, err := s.engine.Thumbnail(r.Context(), v.Tenant, ref)
	if errors.Is(err, imagestore.ErrNotFound) {
		http.Error(w, "no such image", http.StatusNotFound)
		return
	}
	if err != nil {
		s.log.WarnContext(r.Context(), "ui: thumbnail", "ref", ref.String(), "err", err)
		http.Error(w, "no thumbnail of this image", http.StatusUnprocessableEntity)
		return
	}
	w.Header().Set("Content-Type", mt)
	w.Header().Set("Cache-Control", "private, max-age=86400")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Write(data)
}
