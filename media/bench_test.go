package media

import (
	"bytes"
	"encoding/base64"
	"image"
	"testing"
)

// BenchmarkHeaderFromBase64 reads the dimensions of a 1 MB-class screenshot
// from its base64 text. The baseline decodes the whole image, which is what a
// naive estimator does and what imgctx never does to count tokens.
func BenchmarkHeaderFromBase64(b *testing.B) {
	cases := map[string][]byte{
		"png":                noisyPNG(b, 1280, 800),
		"jpeg":               jpegOf(b, 1280, 800),
		"jpeg-2KB-metadata":  withEXIF(jpegOf(b, 1280, 800), 1, 2000),
		"jpeg-60KB-metadata": withEXIF(jpegOf(b, 1280, 800), 1, 60000),
	}
	for name, img := range cases {
		s := base64.StdEncoding.EncodeToString(img)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, err := HeaderFromBase64(s, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("baseline=full-decode-"+name, func(b *testing.B) {
			for b.Loop() {
				data, _ := base64.StdEncoding.DecodeString(s)
				if _, _, err := image.Decode(bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
