package wire

import (
	"bytes"
	"testing"
)

func FuzzParseObject(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[1,2],"c":{"d":null}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := ParseObject(b)
		if err != nil {
			return
		}
		out, _ := o.MarshalJSON()
		again, err := ParseObject(out)
		if err != nil || len(again) != len(o) {
			t.Fatalf("re-encoded object does not parse the same: %v", err)
		}
		for i := range o {
			if o[i].Key != again[i].Key || !bytes.Equal(o[i].Value, again[i].Value) {
				t.Fatalf("field %d changed", i)
			}
		}
	})
}
