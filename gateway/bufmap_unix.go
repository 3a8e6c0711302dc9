//go:build unix

package gateway

import "syscall"

// mapsBuffers: body buffers are mapped outside the Go heap here.
const mapsBuffers = true

// mapBuffer maps n bytes of anonymous memory outside the Go heap, or
// takes them from the heap if the system refuses.
func mapBuffer(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n)
	}
	return b
}

// unmapBuffer hands a mapBuffer's memory back to the system (a heap one
// is left to the collector).
func unmapBuffer(b []byte) { syscall.Munmap(b) }
