package engine

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

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
	out := withHandles(msgs, f.r.Key, func(m chat.Marker) {
		fresh = append(fresh, recallOf(m, f.r.Key, f.r.Model, now))
	})
	f.e.recordRecalls(ctx, f.r.Tenant, f.r.Key, fresh)
	return out
}

// recallOf is the record of a marker's handle.
func recallOf(m chat.Marker, conversation, model string, now time.Time) session.Recall {
	return session.Recall{Handle: m.Handle, Conversation: conversation, Ref: m.Ref, MediaType: m.MediaType,
		Caption: m.Caption, Reason: reason.Code(m.Reason), Model: model, Removed: now}
}

// recordRecalls writes the handles this process has not written yet for
// the conversation. A failed write is logged and tried again at the next
// request.
func (e *Engine) recordRecalls(ctx context.Context, tenant, conversation string, rs []session.Recall) {
	en := e.proxied.entry(tenant, conversation)
	rs = slices.DeleteFunc(rs, func(r session.Recall) bool { return en.recorded(r.Handle) })
	if len(rs) == 0 {
		return
	}
	if err := e.Sessions.SaveRecalls(ctx, tenant, rs); err != nil {
		e.log().WarnContext(ctx, "recall handles not recorded; tried again at the next request", "handles", len(rs), "err", err)
		return
	}
	en.record(rs)
}

// withHandles returns msgs with each image marker naming its handle in
// the conversation, and calls each (when not nil) with every such marker.
func withHandles(msgs []chat.Message, conversation string, each func(chat.Marker)) []chat.Message {
	return editParts(msgs, func(_ wire.Pos, p chat.Part) (chat.Part, bool) {
		m, ok := p.(chat.Marker)
		if !ok || m.Of != "image" || !m.Ref.Valid() || m.Handle != "" {
			return nil, false
		}
		m.Handle = RecallHandle(conversation, m.Ref)
		if each != nil {
			each(m)
		}
		return m, true
	})
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

// recallTool is the tool a session with recall offers its model.
var recallTool = wire.Tool{Name: chat.RecallTool,
	Description: "Show again an image of this conversation that was removed from the context. Pass the handle its marker names: " +
		"[image removed … — recall with " + chat.RecallTool + "(\"i…\")].",
	Parameters: json.RawMessage(`{"type":"object","properties":{"handle":{"type":"string","description":"the handle the marker names"}},"required":["handle"]}`)}

// maxRecallRounds bounds the replies of one call the engine answers
// itself: past it the tool is no longer offered for the call, and the
// model answers without it.
const maxRecallRounds = 8

// conversation names the session for its recall handles.
func (c *call) conversation() string { return sessionConversation(c.tenant, c.meta.ID) }

// sessionConversation is what a session's handles are derived from: no
// proxied conversation's key (64 hex digits) can be it.
func sessionConversation(tenant string, id session.ID) string {
	return "session\x00" + tenant + "\x00" + string(id)
}

// offersRecall says whether the next request offers the recall tool.
func (c *call) offersRecall() bool { return c.meta.Settings.Recall && c.recallRounds < maxRecallRounds }

// answerRecalls answers the reply's calls of the recall tool from the
// store, appended after it as a tool message: each image a tool image of
// the turn (relayed: measured, budgeted like any other), an unknown handle
// a tool error. It says whether the reply called other tools too: the
// client answers those, and the turn goes back to it.
func (c *call) answerRecalls(ctx context.Context, reply chat.Message) (answered int, others bool, err error) {
	var results []chat.Part
	for _, p := range reply.Parts {
		tc, ok := p.(chat.ToolCall)
		if !ok {
			continue
		}
		if tc.Name != chat.RecallTool {
			others = true
			continue
		}
		var args struct {
			Handle string `json:"handle"`
		}
		json.Unmarshal([]byte(tc.Arguments), &args)
		parts, found, err := c.recallPart(ctx, args.Handle)
		if err != nil {
			return 0, false, err
		}
		results = append(results, chat.ToolResult{CallID: tc.ID, Name: chat.RecallTool, IsError: !found, Parts: parts})
	}
	if len(results) == 0 {
		return 0, others, nil
	}
	m := c.relay(chat.Message{Role: chat.Tool, Parts: results})
	c.st.Live = append(c.st.Live, m)
	c.entries = append(c.entries, session.Entry{Message: &m})
	return len(results), others, nil
}

// recallPart is what a recall call gets: a line saying what the image is
// and the image (found), or a line saying why there is none. Only the
// session's own markers answer: a handle from another conversation is
// unknown here.
func (c *call) recallPart(ctx context.Context, handle string) (parts []chat.Part, found bool, err error) {
	unknown := func(ref blob.Ref, why, text string) ([]chat.Part, bool, error) {
		c.emit(Event{Kind: "recalled", Ref: ref, Reason: reason.Invalid, Detail: why})
		return []chat.Part{chat.Text{Text: fmt.Sprintf("%s: %s", ErrUnknownHandle, text)}}, false, nil
	}
	var marker *chat.Marker
	if ValidHandle(handle) {
		conv := c.conversation()
		for _, m := range c.st.Live {
			chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
				if mk, ok := p.(chat.Marker); ok && mk.Of == "image" && mk.Ref.Valid() && RecallHandle(conv, mk.Ref) == handle {
					marker = &mk
				}
				return marker == nil
			})
			if marker != nil {
				break
			}
		}
	}
	if marker == nil {
		return unknown(blob.Ref{}, "unknown handle "+clipHandle(handle), fmt.Sprintf("%q is not a handle of this conversation", clipHandle(handle)))
	}
	msgs, err := c.e.Ingest(ctx, c.tenant, []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.Image{URL: RefScheme + marker.Ref.String(), Caption: marker.Caption}}}})
	if errors.Is(err, ErrUnknownRef) {
		return unknown(marker.Ref, handle+": collected from the image store", handle+" no longer holds its image")
	}
	if err != nil {
		return nil, false, err
	}
	img := msgs[0].Parts[0].(chat.Image)
	img.Origin = chat.FromTool
	about := fmt.Sprintf("Image %s (removed: %s)", handle, marker.Reason)
	if marker.Caption != "" {
		about += " — " + marker.Caption
	}
	c.emit(Event{Kind: "recalled", Ref: marker.Ref, Detail: handle})
	return []chat.Part{chat.Text{Text: about}, img}, true, nil
}
