package openai

import (
	"encoding/base64"
	"testing"

	"github.com/imgctx/imgctx/internal/bodies"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// BenchmarkScanAgent: reading an agent body in place (200 messages, 6
// screenshots, ≈2.2 MB): validation and the scan for slots.
//
//	go test ./wire/openai -run XXX -bench ScanAgent
func BenchmarkScanAgent(b *testing.B) {
	var shots []string
	for i := range 6 {
		shots = append(shots, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(bodies.Screenshot(uint64(i))))
	}
	body := bodies.Agent(shots)
	b.Run("valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			jsonspan.End(body, jsonspan.Skip(body, 0))
		}
	})
	b.Run("scan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := Scan(body, wire.ScanOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
