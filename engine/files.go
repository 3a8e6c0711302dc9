package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// Files are the images sent by reference to a provider's Files API
// (upstreams[].file_ids): uploaded once per image, upstream, credential and
// wire, found again in the session store, and sent as the file's id from
// then on. The credentials a file was uploaded with are held in memory
// only, to delete it when it goes stale; the store keeps their fingerprint.
type providerFiles struct {
	mu     sync.Mutex
	known  map[session.FileKey]session.ProviderFile
	flight map[session.FileKey]*fileFlight
	off    map[string]time.Time // upstream and credential: no uploads until then (a quota)
	calls  map[string]heldCall  // credential fingerprint: how to reach its files
}

type fileFlight struct {
	done chan struct{}
	f    session.ProviderFile
	err  error
}

type heldCall struct {
	call  wire.Call
	files *wire.Files
}

const (
	// maxKnownFiles bounds the files remembered in memory; past it the
	// memory starts over and the store answers.
	maxKnownFiles = 100_000
	// fileUploads is how many uploads one request runs at once.
	fileUploads = 4
	// fileTouch is how stale a file's last use may be written: a request
	// writes it at most that often.
	fileTouch = 10 * time.Minute
	// fileMargin: a file that expires sooner is uploaded again, never sent.
	fileMargin = time.Hour
	// maxHeldCalls bounds the credentials held in memory to delete files.
	maxHeldCalls = 10_000
)

// FilesOff is how long a provider's quota error turns file uploads off for
// that credential (default 10 minutes): images go as base64 meanwhile.
func (e *Engine) filesOff() time.Duration {
	if e.FilesOffFor > 0 {
		return e.FilesOffFor
	}
	return 10 * time.Minute
}

// fileSender sends one request's images by file id.
type fileSender struct {
	e      *Engine
	tenant string
	files  *wire.Files
	call   wire.Call
	base   session.FileKey // upstream, credential and wire; Ref per image
	got    map[blob.Ref]session.ProviderFile
	sent   []session.ProviderFile // in the last body written
	counts *ProxyCounts
}

// fileSenderFor is the request's file sender, nil when its images go as
// base64: the route does not ask for file ids, the wire has no file form,
// the request carries no credential, or a quota turned uploads off.
func (e *Engine) fileSenderFor(c ProxyCall, route *Route, counts *ProxyCounts) *fileSender {
	if !route.Files {
		return nil
	}
	return e.newFileSender(c.Tenant, route.Client, c.Wire, c.Upstream, counts)
}

// newFileSender is a file sender for requests of wire d to client with
// req's credentials (nil when it cannot send files).
func (e *Engine) newFileSender(tenant string, client *upstream.Client, d *wire.Dialect, req upstream.Request, counts *ProxyCounts) *fileSender {
	if d.Files == nil {
		return nil
	}
	cred := client.Credential(req)
	if cred == "" {
		return nil
	}
	fp := client.Fingerprint(cred)
	base := session.FileKey{Upstream: strings.TrimRight(client.BaseURL, "/"), Credential: fp, Wire: d.Name}
	pf := &e.files
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if until, ok := pf.off[base.Upstream+"\x00"+fp]; ok {
		if e.now().Before(until) {
			counts.FilesOff = true
			return nil
		}
		delete(pf.off, base.Upstream+"\x00"+fp)
	}
	call := client.FileCall(req)
	if pf.calls == nil || len(pf.calls) >= maxHeldCalls {
		pf.calls = map[string]heldCall{} // past it, files of older credentials are left to gc and expiry
	}
	pf.calls[fp] = heldCall{call: call, files: d.Files}
	return &fileSender{e: e, tenant: tenant, files: d.Files, call: call, base: base, got: map[blob.Ref]session.ProviderFile{}, counts: counts}
}

// prepare finds or uploads a file for each image, a few at a time; an
// image whose upload fails goes as base64 in this request.
func (s *fileSender) prepare(ctx context.Context, imgs []chat.Image) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := make(chan struct{}, fileUploads)
	for _, img := range imgs {
		mu.Lock()
		_, seen := s.got[img.Ref]
		if !seen {
			s.got[img.Ref] = session.ProviderFile{} // once per request
		}
		mu.Unlock()
		if seen || !img.Ref.Valid() {
			continue
		}
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			f, uploaded, err := s.e.providerFile(ctx, s, img)
			mu.Lock()
			defer mu.Unlock()
			if uploaded {
				s.counts.FilesUploaded++
			}
			if err != nil {
				s.counts.FileFallbacks++
				s.e.log().WarnContext(ctx, "an upload to the provider's Files API failed: the image goes as base64 in this request", "upstream", s.base.Upstream, "err", err)
				delete(s.got, img.Ref)
				return
			}
			s.got[img.Ref] = f
		}()
	}
	wg.Wait()
}

// edit is the change that sends slot's image by reference, if it has a
// file.
func (s *fileSender) edit(body []byte, slot wire.Slot, img chat.Image) (wire.Edit, bool) {
	f, ok := s.got[img.Ref]
	if !ok || f.ID == "" {
		return wire.Edit{}, false
	}
	s.sent = append(s.sent, f)
	s.counts.FilesSent++
	return s.files.Edit(body, slot, wire.File{ID: f.ID, URI: f.URI, Expires: f.Expires}), true
}

// providerFile returns the file of an image at the sender's upstream,
// uploading it when there is none (or it expires soon): one upload per
// image however many requests ask at once (uploaded: this call's).
func (e *Engine) providerFile(ctx context.Context, s *fileSender, img chat.Image) (f session.ProviderFile, uploaded bool, err error) {
	k := s.base
	k.Ref = img.Ref
	pf := &e.files
	now := e.now()
	pf.mu.Lock()
	f, ok := pf.known[k]
	if fl := pf.flight[k]; fl != nil {
		pf.mu.Unlock()
		select {
		case <-fl.done:
			return fl.f, false, fl.err
		case <-ctx.Done():
			return session.ProviderFile{}, false, ctx.Err()
		}
	}
	fl := &fileFlight{done: make(chan struct{})}
	if pf.flight == nil {
		pf.flight = map[session.FileKey]*fileFlight{}
	}
	pf.flight[k] = fl
	pf.mu.Unlock()
	defer func() {
		pf.mu.Lock()
		delete(pf.flight, k)
		if fl.err == nil {
			if pf.known == nil || len(pf.known) >= maxKnownFiles {
				pf.known = map[session.FileKey]session.ProviderFile{}
			}
			pf.known[k] = fl.f
		}
		pf.mu.Unlock()
		close(fl.done)
	}()
	if !ok {
		stored, err := e.Sessions.LoadFile(ctx, k)
		switch {
		case err == nil:
			f, ok = stored, true
		case !errors.Is(err, session.ErrNotFound):
			fl.err = err
			return fl.f, false, fl.err
		}
	}
	if ok && (f.Expires.IsZero() || f.Expires.Sub(now) > fileMargin) {
		if now.Sub(f.Used) > fileTouch {
			f.Used = now
			if err := e.Sessions.SaveFile(ctx, f); err != nil {
				e.log().WarnContext(ctx, "recording a provider file's use failed", "err", err)
			}
		}
		fl.f = f
		return fl.f, false, nil
	}
	fl.f, fl.err = e.upload(ctx, s, k, img)
	return fl.f, fl.err == nil, fl.err
}

// upload stores an image at the provider and records its file.
func (e *Engine) upload(ctx context.Context, s *fileSender, k session.FileKey, img chat.Image) (session.ProviderFile, error) {
	data, err := e.Images.Get(ctx, s.tenant, img.Ref)
	if err != nil {
		return session.ProviderFile{}, fmt.Errorf("reading %s to upload it: %w", img.Ref, err)
	}
	wf, err := s.files.Upload(ctx, s.call, data, img.MediaType)
	if err != nil {
		var fe *wire.FileError
		if errors.As(err, &fe) && (fe.Quota || fe.Unsupported) {
			e.filesOffFor(ctx, k, fe)
		}
		return session.ProviderFile{}, err
	}
	now := e.now().UTC()
	f := session.ProviderFile{FileKey: k, ID: wf.ID, URI: wf.URI, Expires: wf.Expires, Uploaded: now, Used: now}
	if err := e.Sessions.SaveFile(ctx, f); err != nil {
		// Not recorded, not used: a file the store does not list would
		// never be deleted.
		_ = s.files.Delete(context.WithoutCancel(ctx), s.call, wf)
		return session.ProviderFile{}, fmt.Errorf("recording an uploaded file: %w", err)
	}
	return f, nil
}

// filesOffFor turns uploads off for a credential for a while: the
// provider's quota is reached, or the upstream has no Files API (tried
// again after the while, not on every request).
func (e *Engine) filesOffFor(ctx context.Context, k session.FileKey, fe *wire.FileError) {
	pf := &e.files
	pf.mu.Lock()
	if pf.off == nil {
		pf.off = map[string]time.Time{}
	}
	pf.off[k.Upstream+"\x00"+k.Credential] = e.now().Add(e.filesOff())
	pf.mu.Unlock()
	e.sink(Event{Kind: "files_off", Detail: k.Upstream})
	why := "the provider refused an upload for its quota"
	if !fe.Quota {
		why = "the upstream has no Files API"
	}
	e.log().WarnContext(ctx, why+": images go as base64 for this credential for a while",
		"upstream", k.Upstream, "credential", k.Credential, "status", fe.Status, "for", e.filesOff())
}

// missing reports whether an upstream error says a file the last body
// named is gone (deleted, expired, another account's), and forgets those
// files so the replay uploads them again. An error naming no file of ours
// but saying a file is missing forgets them all.
func (s *fileSender) missing(ctx context.Context, err error) bool {
	var we *wire.Error
	if s == nil || len(s.sent) == 0 || !errors.As(err, &we) || we.Status != 400 && we.Status != 403 && we.Status != 404 {
		return false
	}
	text := we.Message + " " + string(we.Body)
	var gone []session.ProviderFile
	for _, f := range s.sent {
		// Gemini names a file without its "files/" in its errors.
		if strings.Contains(text, f.ID[strings.LastIndexByte(f.ID, '/')+1:]) || f.URI != "" && strings.Contains(text, f.URI) {
			gone = append(gone, f)
		}
	}
	if len(gone) == 0 && strings.Contains(strings.ToLower(text), "file") && we.Status != 400 {
		gone = s.sent
	}
	if len(gone) == 0 {
		return false
	}
	pf := &s.e.files
	pf.mu.Lock()
	for _, f := range gone {
		delete(pf.known, f.FileKey)
		delete(s.got, f.Ref)
	}
	pf.mu.Unlock()
	for _, f := range gone {
		if err := s.e.Sessions.DeleteFile(ctx, f.FileKey); err != nil {
			s.e.log().WarnContext(ctx, "forgetting a provider file failed", "err", err)
		}
	}
	s.counts.FilesMissing += len(gone)
	s.sent = nil
	return true
}

// header is the request's headers with what file references need (a
// beta the provider asks for), merged with the client's value.
func (s *fileSender) header(h http.Header) http.Header {
	if s == nil || len(s.sent) == 0 || len(s.files.Header) == 0 {
		return h
	}
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for k, v := range s.files.Header {
		have := strings.Join(out[k], ",")
		if !strings.Contains(have, v) {
			out[k] = []string{strings.TrimLeft(have+","+v, ",")}
		}
	}
	return out
}

// SweepFiles deletes at their providers the files no request used within
// idle (proxy.idle_expiry: no live conversation sends them; a use is
// written at most every ten minutes, which the cut-off allows for), and
// forgets them with those the provider expired itself. A file is deleted
// only with the credential it was uploaded with: one the process holds
// (uploaded or used since it started), the configured key of one of
// routes, or one of keys (auth.upstream_keys) at one of them. Files of
// other credentials are left, and counted.
func (e *Engine) SweepFiles(ctx context.Context, idle time.Duration, routes []*Route, keys ...string) (deleted, left int, err error) {
	e.once.Do(e.init)
	stale, err := e.Sessions.StaleFiles(ctx, e.now().Add(-idle-fileTouch))
	if err != nil {
		return 0, 0, err
	}
	now := e.now()
	for _, f := range stale {
		if !f.Expires.IsZero() && f.Expires.Before(now) {
			// The provider forgot it already.
			if err := e.forgetFile(ctx, f.FileKey); err != nil {
				return deleted, left, err
			}
			deleted++
			continue
		}
		held, ok := e.heldCall(f.FileKey, routes, keys)
		if !ok {
			left++
			continue
		}
		if err := held.files.Delete(ctx, held.call, wire.File{ID: f.ID, URI: f.URI}); err != nil {
			e.log().WarnContext(ctx, "deleting a provider file failed: it is tried again at the next sweep", "upstream", f.Upstream, "file", f.ID, "err", err)
			left++
			continue
		}
		if err := e.forgetFile(ctx, f.FileKey); err != nil {
			return deleted, left, err
		}
		deleted++
	}
	return deleted, left, nil
}

func (e *Engine) forgetFile(ctx context.Context, k session.FileKey) error {
	e.files.mu.Lock()
	delete(e.files.known, k)
	e.files.mu.Unlock()
	return e.Sessions.DeleteFile(ctx, k)
}

// heldCall is how to reach a file's provider with its credential.
func (e *Engine) heldCall(k session.FileKey, routes []*Route, keys []string) (heldCall, bool) {
	e.files.mu.Lock()
	held, ok := e.files.calls[k.Credential]
	e.files.mu.Unlock()
	files := upstream.FilesAPIs[k.Wire]
	if ok || files == nil {
		return held, ok
	}
	for _, r := range routes {
		if strings.TrimRight(r.Client.BaseURL, "/") != k.Upstream {
			continue
		}
		for _, key := range append([]string{r.Client.APIKey}, keys...) {
			req := upstream.Request{APIKey: key}
			if key != "" && r.Client.Fingerprint(r.Client.Credential(req)) == k.Credential {
				return heldCall{call: r.Client.FileCall(req), files: files}, true
			}
		}
	}
	return heldCall{}, false
}

// A session's requests send images by file id too when its upstream does
// (upstream.file_ids, a wire with a file form: Anthropic), with the same
// cache-safe rule as a proxied conversation: the live context's images
// before the session's files_from keep the form the cache holds them in.

// sessionFiles is the call's file sender, made at its first request.
func (c *call) sessionFiles() *fileSender {
	if c.files == nil && c.e.UpstreamFiles && c.e.Upstream != nil {
		c.files = c.e.newFileSender(c.tenant, c.e.Upstream, c.e.sessionWire(), upstream.Request{}, &ProxyCounts{})
	}
	return c.files
}

// advanceFiles moves the session's files_from for a main request of msgs:
// to 0 for a new session or a cold cache, to the first message that
// differs from what the previous request sent (a removal, a compaction),
// and to the previous request's length the first time file ids apply.
func (c *call) advanceFiles(msgs []chat.Message) {
	if c.sessionFiles() == nil {
		return
	}
	if c.sent == nil {
		c.sent = c.before // the first main request of the turn
	}
	from := len(c.sent)
	if c.st.FilesFrom != nil {
		from = *c.st.FilesFrom
	}
	if c.st.LastActivity.IsZero() || c.e.now().Sub(c.st.LastActivity) > c.e.cacheTTL() {
		from = 0
	}
	k := 0
	for k < min(len(msgs), len(c.sent)) && chat.Equal(msgs[k], c.sent[k]) {
		k++
	}
	from = min(from, k)
	c.st.FilesFrom = &from
	c.sent = slices.Clone(msgs)
}

// fileSource is src with the images of msgs from the session's files_from
// on sent by file id (uploaded first where the provider has none). An
// image that also stands before files_from keeps its base64 everywhere:
// what a cached prefix holds never changes form.
func (c *call) fileSource(ctx context.Context, msgs []chat.Message, src func(chat.Image) (string, string, string, error)) func(chat.Image) (string, string, string, error) {
	files := c.sessionFiles()
	if files == nil || c.st.FilesFrom == nil {
		return src
	}
	from := *c.st.FilesFrom
	inline := map[blob.Ref]bool{}
	var imgs []chat.Image
	eachImage(msgs, func(at wire.Pos, img chat.Image) {
		if at.Msg < from {
			inline[img.Ref] = true
		} else {
			imgs = append(imgs, img)
		}
	})
	imgs = slices.DeleteFunc(imgs, func(img chat.Image) bool { return inline[img.Ref] })
	files.sent = files.sent[:0]
	files.prepare(ctx, imgs)
	return func(img chat.Image) (string, string, string, error) {
		if f, ok := files.got[img.Ref]; ok && f.ID != "" && !inline[img.Ref] {
			files.sent = append(files.sent, f)
			return img.MediaType, "", wire.FileURL(f.ID), nil
		}
		return src(img)
	}
}
