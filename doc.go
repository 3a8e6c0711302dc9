// Package imgctx is the module root of imgctx, an image-aware context
// engine for LLM agents. The code lives in the packages below; imports point
// one way, downwards, and deps_test.go asserts it:
//
//	blob, reason       content refs, reason codes        (standard library only)
//	mimetype           MIME strings made safe            (standard library only)
//	chat               the conversation model            → blob, mimetype
//	imagestore         image bytes by ref, per tenant    → blob
//	media              untrusted image input             → blob, mimetype, reason
//	tokens             profiles, token estimates         → chat, blob
//	policy             keep, evict, compact, replay      → chat, tokens, blob, mimetype, reason
//	session            append-only log + resumable state → chat, policy, imagestore
//	session/sqlite     the embedded session store        → session
//	wire, wire/openai, wire/anthropic  provider JSON ⇄ chat  → chat
//	upstream           HTTP to the model, with retries   → wire
//	engine             the turn loop                     → everything above but config
//	gateway            HTTP: proxy, images, sessions     → engine and below
//	internal/config    configuration                     → media, tokens, imagestore
//	cmd/imgctx         the command line                  → everything above
package imgctx
