module github.com/imgctx/imgctx

go 1.26.0

require (
	code.dny.dev/ssrf v0.3.0
	pgregory.net/rapid v1.3.0
)

require golang.org/x/image v0.48.0

require golang.org/x/net v0.62.0
