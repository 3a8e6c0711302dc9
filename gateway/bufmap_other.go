//go:build !unix

package gateway

// mapsBuffers: body buffers are on the Go heap here.
const mapsBuffers = false

// mapBuffer: no anonymous mappings here, so the heap's.
func mapBuffer(n int) []byte { return make([]byte, n) }

// unmapBuffer: the collector takes it once nothing holds it.
func unmapBuffer([]byte) {}
