package gateway

import (
	"hash/maphash"
	"net/http"

	"github.com/imgctx/imgctx/wire"
)

// resumed is what the gateway keeps of a conversation's last request: its
// scan (wire.Resume) and the span key of each of its slots, so the next
// request — the same history with a few messages more — is read from where
// they part and its re-sent images are not hashed again.
type resumed struct {
	res  *wire.Resume
	keys []*spanKey
}

// resumeKey names a conversation cheaply: the tenant, the wire, the
// agent's own conversation headers when it sends them, and the first
// kilobytes of the body (model, system prompt, first messages). Two
// conversations that share a key only evict each other's entry: a resumed
// scan checks every byte it takes over.
type resumeKey struct {
	tenant string
	h      uint64
}

// conversationHeaders are the headers agents name their conversations by.
var conversationHeaders = []string{"X-Imgctx-Session", "X-Claude-Code-Session-Id", "Session-Id"}

func (s *Server) resumeKeyOf(tenant, wireName string, h http.Header, body []byte) resumeKey {
	var mh maphash.Hash
	mh.SetSeed(s.spanSeed)
	mh.WriteString(wireName)
	for _, k := range conversationHeaders {
		mh.WriteString(h.Get(k))
		mh.WriteByte(0)
	}
	mh.Write(body[:min(len(body), 4096)])
	return resumeKey{tenant, mh.Sum64()}
}

// maxResumes bounds the conversations remembered; past it the gateway
// starts over (an entry holds a view of a request, not its bytes).
const maxResumes = 256

func (s *Server) resumeFor(k resumeKey) resumed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumes[k]
}

func (s *Server) keepResume(k resumeKey, r resumed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.resumes) >= maxResumes {
		clear(s.resumes)
	}
	s.resumes[k] = r
}
