// Package imgctx is the module root of imgctx, an image-aware context
// engine for LLM agents. The code lives in the packages below; imports point
// one way, downwards, and deps_test.go asserts it (docs/design.md
// "Packages" is the same table, with what each package is):
//
//	blob, reason, mimetype   content refs, reason codes, safe MIME strings   (standard library only)
//	chat                     the conversation model                          → blob, mimetype
//	imagestore, .../s3       image bytes by ref, per tenant                  → blob
//	media                    untrusted image input, fetching, shrinking      → blob, mimetype, reason
//	tokens                   profiles, token estimates                       → blob, chat
//	policy                   keep, evict, compact, replay, provider rules    → blob, chat, mimetype, reason, tokens
//	session, .../sqlite, .../postgres  the session log, proxied decisions   → blob, chat, imagestore, policy, reason
//	wire                     Dialect, a body read in place, splice, SSE      → blob, chat, mimetype, wire/jsonspan
//	wire/openai, anthropic, responses, gemini, flat   one wire each         → chat, wire (responses, flat: wire/openai)
//	upstream                 HTTP to the model, retries; Wires, the table    → wire and the wire packages
//	engine                   sessions (Call) and drop-in requests (Proxy)    → everything above
//	gateway                  HTTP only: routes, auth, limits, relaying       → engine, session, upstream, wire; never policy, media, tokens
//	sim                      the simulator                                   → engine, gateway and below
//	internal/config          configuration                                   → imagestore, media, policy, tokens
//	cmd/imgctx               the command line                                → everything above
package imgctx
