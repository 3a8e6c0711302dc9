module github.com/imgctx/imgctx

go 1.26.0

require (
	code.dny.dev/ssrf v0.3.0
	pgregory.net/rapid v1.3.0
)

require golang.org/x/image v0.48.0

require (
	github.com/tiktoken-go/tokenizer v0.10.0
	go.yaml.in/yaml/v3 v3.0.4
	golang.org/x/net v0.62.0
)

require github.com/dlclark/regexp2/v2 v2.5.1 // indirect
