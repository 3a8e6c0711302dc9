package wire

import (
	"bufio"
	"bytes"
	"io"
)

// Event is one server-sent event.
type Event struct {
	Name string // the "event:" field, "" when absent
	Data []byte // the "data:" lines joined with newlines
	Raw  []byte // the event's bytes as received, blank line included, to forward unchanged
}

// SSEReader reads server-sent events from a stream, keeping each event's
// raw bytes so a proxy can forward it as it came.
type SSEReader struct {
	r *bufio.Reader
}

// MaxEventBytes bounds one event; a longer one is an error, not a stall.
const MaxEventBytes = 16 << 20

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader { return &SSEReader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event, or io.EOF after the last one.
func (s *SSEReader) Next() (Event, error) {
	var ev Event
	var raw bytes.Buffer
	var data [][]byte
	for {
		line, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long line: gather it whole, within the bound.
			full := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull && len(full) <= MaxEventBytes {
				line, err = s.r.ReadSlice('\n')
				full = append(full, line...)
			}
			if len(full) > MaxEventBytes {
				return Event{}, io.ErrShortBuffer
			}
			line = full
		}
		raw.Write(line)
		trimmed := bytes.TrimRight(line, "\r\n")
		switch {
		case len(trimmed) == 0 && len(line) > 0:
			if raw.Len() == len(line) { // a blank line before any field: skip it
				raw.Reset()
				break
			}
			ev.Data = bytes.Join(data, []byte("\n"))
			ev.Raw = raw.Bytes()
			return ev, nil
		case bytes.HasPrefix(trimmed, []byte("data:")):
			data = append(data, bytes.TrimPrefix(bytes.TrimPrefix(trimmed, []byte("data:")), []byte(" ")))
		case bytes.HasPrefix(trimmed, []byte("event:")):
			ev.Name = string(bytes.TrimSpace(bytes.TrimPrefix(trimmed, []byte("event:"))))
		}
		if raw.Len() > MaxEventBytes {
			return Event{}, io.ErrShortBuffer
		}
		if err != nil {
			if err == io.EOF && raw.Len() > 0 && len(data) > 0 {
				ev.Data = bytes.Join(data, []byte("\n"))
				ev.Raw = raw.Bytes()
				return ev, nil
			}
			return Event{}, err
		}
	}
}

// AppendEvent appends one server-sent event: its name (none when ""), and
// its data, a literal string or a value written as JSON.
func AppendEvent(b []byte, name string, data any) []byte {
	if name != "" {
		b = append(append(append(b, "event: "...), name...), '\n')
	}
	s, ok := data.(string)
	if !ok {
		j, _ := Marshal(data)
		s = string(j)
	}
	return append(append(append(b, "data: "...), s...), "\n\n"...)
}
