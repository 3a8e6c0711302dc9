package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
)

// Recall is the recall model: a share of the images imgctx removes are
// asked for again, After steps later (one a step: a batch's are asked
// for on the steps after), the way a model does with imgctx_recall — one
// request more, answered by a tool result carrying the image. Which images is fixed by their content, so every row with
// recall asks for the same ones when it removes them.
type Recall struct {
	Share float64 // of the removed images, 0 to 1
	After int     // steps after the removal (at least 1)
}

// On reports whether the model recalls at all.
func (r Recall) On() bool { return r.Share > 0 }

// RecallPeers are the imgctx rows again, each with the recall model.
func RecallPeers(peers []Peer, rc Recall) []Peer {
	if !rc.On() {
		return nil
	}
	var out []Peer
	for _, p := range peers {
		if p.Through && p.Schedule == nil && !p.judgesOnly() {
			q := p
			q.Name += "+recall"
			q.Reproduces += fmt.Sprintf("; the model recalls %g of the removed images %d steps later (imgctx_recall, one request each time)", rc.Share, rc.After)
			q.Recall = true
			out = append(out, q)
		}
	}
	return out
}

// FilesPeers are the imgctx rows run again with file ids (+files): each
// image uploaded once to the emulated provider's Files API and sent by
// reference, so the report shows the bytes each sends beside the row
// without.
func FilesPeers(peers []Peer) []Peer {
	var out []Peer
	for _, p := range peers {
		if p.Through && p.Schedule == nil && !p.Recall && !p.judgesOnly() {
			q := p
			q.Name += "+files"
			q.Reproduces += "; images by file id (upstream.file_ids auto): uploaded once, then sent by reference"
			q.Files = true
			out = append(out, q)
		}
	}
	return out
}

// chosen says whether the image behind ref is one the model recalls: the
// first eight bytes of its digest as a fraction, under the share.
func (r Recall) chosen(ref blob.Ref) bool {
	d := ref.Digest()
	return float64(binary.BigEndian.Uint64(d[:8]))/(1<<64) < r.Share
}

// recallState is a run's pending recalls.
type recallState struct {
	byRef    map[blob.Ref]*Image
	due      map[int][]*Image // by step
	recalled map[blob.Ref]bool
	calls    int
}

// removedImage schedules the recall of an image imgctx removed, once per
// image.
func (r *runner) removedImage(ref blob.Ref) {
	rc := r.cfg.Recall
	if !r.peer.Recall || !rc.On() || r.recall.recalled[ref] || !rc.chosen(ref) {
		return
	}
	if r.recall.byRef == nil {
		r.recall.byRef, r.recall.due, r.recall.recalled = map[blob.Ref]*Image{}, map[int][]*Image{}, map[blob.Ref]bool{}
		for _, im := range r.cfg.Workload.Images {
			if b, err := base64.StdEncoding.DecodeString(im.B64); err == nil {
				r.recall.byRef[blob.Of(b)] = im
			}
		}
	}
	im, ok := r.recall.byRef[ref]
	if !ok || im.Pages > 0 {
		return // a document, or an image imgctx made (a shrunk copy)
	}
	r.recall.recalled[ref] = true
	// One image a request, as a model asks: a batch's chosen images are
	// asked for on consecutive steps from After on.
	at := r.stepAt + max(rc.After, 1)
	for len(r.recall.due[at]) > 0 {
		at++
	}
	r.recall.due[at] = append(r.recall.due[at], im)
}

// recallDue appends, before step i, the model's recall of the images due
// then — its call and the agent's tool result carrying them — and sends
// that request. It says how many it recalled.
func (r *runner) recallDue(ctx context.Context, i int) (int, error) {
	ims := r.recall.due[i]
	if len(ims) == 0 {
		return 0, nil
	}
	delete(r.recall.due, i)
	call := Msg{Role: "assistant", Parts: []Part{{Text: "Let me look at that earlier screenshot again."}}}
	result := Msg{Role: "user"}
	for _, im := range ims {
		r.recall.calls++
		id := fmt.Sprintf("toolu_recall_%04d", r.recall.calls)
		call.Parts = append(call.Parts, Part{Call: &Call{ID: id, Name: chat.RecallTool, Input: fmt.Sprintf(`{"handle":"i%011d"}`, im.ID)}})
		result.Parts = append(result.Parts, Part{Result: &Result{CallID: id, Parts: []Part{{Text: "Image recalled."}, {Image: im}}}})
	}
	r.transcript = append(r.transcript, call, result)
	if _, err := r.step(ctx, estimate(r.cfg.Profile, []Msg{call, result})); err != nil {
		return 0, err
	}
	return len(ims), nil
}
