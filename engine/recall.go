package engine

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire"
)

// handleLetters is a handle's length after its "i": 55 bits of a SHA-256,
// so that the handles of one tenant do not collide (one in a million at
// two hundred thousand removed images) and cannot be guessed from a ref.
const handleLetters = 11

var handleEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// RecallHandle names an image within one conversation (its key): the same
// image gets the same handle at every request, so a marker's text never
// changes and the cached prefix holds; another conversation's handle for
// it differs.
func RecallHandle(conversation string, ref blob.Ref) string {
	sum := sha256.Sum256([]byte("imgctx recall\x00" + conversation + "\x00" + ref.String()))
	return "i" + handleEncoding.EncodeToString(sum[:])[:handleLetters]
}

// ValidHandle says whether s has a handle's shape, so a malformed one is
// refused before any store is asked.
func ValidHandle(s string) bool {
	if len(s) != 1+handleLetters || s[0] != 'i' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// ErrUnknownHandle: no image of the tenant answers to the handle.
var ErrUnknownHandle = errors.New("unknown recall handle")

// recallable gives every image marker of msgs its handle in the
// conversation and records the handles not recorded yet, before the
// request is sent: the model may ask for any of them once it has read the
// answer. A failed write is logged and tried again at the next request;
// the marker keeps its handle, whose text must not change.
func (f *proxyTurn) recallable(ctx context.Context, msgs []chat.Message) []chat.Message {
	var fresh []session.Recall
	now := f.e.now()
	out := editParts(msgs, func(_ wire.Pos, p chat.Part) (chat.Part, bool) {
		m, ok := p.(chat.Marker)
		if !ok || m.Of != "image" || !m.Ref.Valid() || m.Handle != "" {
			return nil, false
		}
		m.Handle = RecallHandle(f.r.Key, m.Ref)
		if !f.en.recorded(m.Handle) {
			fresh = append(fresh, session.Recall{Handle: m.Handle, Conversation: f.r.Key, Ref: m.Ref, MediaType: m.MediaType,
				Caption: m.Caption, Reason: reason.Code(m.Reason), Model: f.r.Model, Removed: now})
		}
		return m, true
	})
	if len(fresh) > 0 {
		if err := f.e.Sessions.SaveRecalls(ctx, f.r.Tenant, fresh); err != nil {
			f.e.log().Warn("recall handles not recorded; tried again at the next request", "handles", len(fresh), "err", err)
		} else {
			f.en.record(fresh)
		}
	}
	return out
}

// recorded says whether the handle was written by this process already.
func (en *proxiedEntry) recorded(handle string) bool {
	en.mu.Lock()
	defer en.mu.Unlock()
	_, ok := en.handles[handle]
	return ok
}

func (en *proxiedEntry) record(rs []session.Recall) {
	en.mu.Lock()
	defer en.mu.Unlock()
	if en.handles == nil {
		en.handles = map[string]struct{}{}
	}
	for _, r := range rs {
		en.handles[r.Handle] = struct{}{}
	}
}

// Recalled is an image asked for again by its handle, as the model may be
// sent it now.
type Recalled struct {
	session.Recall
	MediaType string // of Data, which a rule may have shrunk
	Data      []byte
	Shrunk    bool
}

// Recall answers a handle within the tenant: the image, shrunk where the
// conversation's model would refuse it as stored.
func (e *Engine) Recall(ctx context.Context, tenant, handle string) (Recalled, error) {
	e.once.Do(e.init)
	r, err := e.lookupRecall(ctx, tenant, handle)
	if err != nil {
		return Recalled{}, err
	}
	data, err := e.Images.Get(ctx, tenant, r.Ref)
	if errors.Is(err, imagestore.ErrNotFound) {
		return Recalled{}, fmt.Errorf("%w: %s no longer holds its image (collected)", ErrUnknownHandle, handle)
	}
	if err != nil {
		return Recalled{}, err
	}
	in, err := media.Inspect(data, "", e.Limits)
	if err != nil {
		return Recalled{}, err
	}
	img := chat.Image{Ref: in.Ref, MediaType: in.MediaType, Bytes: in.Bytes, Width: in.Width, Height: in.Height, Caption: r.Caption, Origin: chat.FromTool}
	out, removed, _, err := e.meetRules(ctx, tenant, []chat.Message{{Role: chat.User, Parts: []chat.Part{img}}}, e.ProfileWith(r.Model, Hints{}).Limits)
	if err != nil {
		return Recalled{}, err
	}
	if len(removed) > 0 {
		return Recalled{}, reason.New(removed[0].Reason, fmt.Sprintf("the image of %s cannot be sent to %s within its rules", handle, r.Model))
	}
	sent, _ := out[0].Parts[0].(chat.Image)
	if sent.Ref != in.Ref {
		if data, err = e.Images.Get(ctx, tenant, sent.Ref); err != nil {
			return Recalled{}, err
		}
	}
	return Recalled{Recall: r, MediaType: sent.MediaType, Data: data, Shrunk: sent.Ref != in.Ref}, nil
}

// Recalls lists the recallable images of the conversation a handle
// belongs to: the handle proves the caller was in it.
func (e *Engine) Recalls(ctx context.Context, tenant, handle string) ([]session.Recall, error) {
	e.once.Do(e.init)
	r, err := e.lookupRecall(ctx, tenant, handle)
	if err != nil {
		return nil, err
	}
	return e.Sessions.ListRecalls(ctx, tenant, r.Conversation)
}

func (e *Engine) lookupRecall(ctx context.Context, tenant, handle string) (session.Recall, error) {
	handle = strings.TrimSpace(handle)
	if !ValidHandle(handle) {
		return session.Recall{}, fmt.Errorf("%w: %q is not a handle (an i and %d letters, as a marker gives it)", ErrUnknownHandle, clipHandle(handle), handleLetters)
	}
	r, err := e.Sessions.LoadRecall(ctx, tenant, handle)
	if errors.Is(err, session.ErrNotFound) {
		return session.Recall{}, fmt.Errorf("%w: %s", ErrUnknownHandle, handle)
	}
	return r, err
}

func clipHandle(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
