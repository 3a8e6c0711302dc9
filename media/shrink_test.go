package media

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"testing"

	"github.com/imgctx/imgctx/reason"
)

func noisyPNG(t testing.TB, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range img.Pix {
		img.Pix[i] = uint8(r.IntN(256))
	}
	var b bytes.Buffer
	png.Encode(&b, img)
	return b.Bytes()
}

func TestShrinkMeetsTarget(t *testing.T) {
	src := noisyPNG(t, 1800, 900)
	got, err := Shrink(src, Target{}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Changed || max(got.Width, got.Height) > DefaultMaxEdge || int64(len(got.Data)) > DefaultTargetBytes {
		t.Fatalf("%d×%d, %d bytes, changed=%v; want ≤ %d px and ≤ %d bytes", got.Width, got.Height, len(got.Data), got.Changed, DefaultMaxEdge, DefaultTargetBytes)
	}
	// The aspect ratio is kept (2:1).
	if got.Width != 2*got.Height && got.Width != 2*got.Height+1 {
		t.Fatalf("aspect changed: %d×%d", got.Width, got.Height)
	}
	in, err := Inspect(got.Data, got.MediaType, Limits{})
	if err != nil || in.Width != got.Width || in.MediaType != got.MediaType {
		t.Fatalf("output does not describe itself: %+v %v", in, err)
	}
}

func TestShrinkKeepsAFittingImage(t *testing.T) {
	src := pngOf(t, 100, 50)
	got, err := Shrink(src, Target{}, Limits{})
	if err != nil || got.Changed || !bytes.Equal(got.Data, src) {
		t.Fatalf("a fitting image was re-encoded: changed=%v err=%v", got.Changed, err)
	}
}

func TestShrinkScreenshotStaysPNG(t *testing.T) {
	// Few colours compress well as PNG; a tight edge target forces a resize.
	big := image.NewRGBA(image.Rect(0, 0, 2000, 1000))
	for i := range big.Pix {
		big.Pix[i] = 200
	}
	var b bytes.Buffer
	png.Encode(&b, big)
	got, err := Shrink(b.Bytes(), Target{MaxEdge: 500}, Limits{})
	if err != nil || got.MediaType != "image/png" || got.Width != 500 || got.Height != 250 {
		t.Fatalf("got %s %d×%d %v", got.MediaType, got.Width, got.Height, err)
	}
}

func TestShrinkAppliesEXIFOrientation(t *testing.T) {
	// 40×30 with a white left column, orientation 6 (rotate 90° clockwise):
	// upright it is 30×40 and the white column becomes the top row.
	img := image.NewGray(image.Rect(0, 0, 40, 30))
	for y := 0; y < 30; y++ {
		for x := 0; x < 40; x++ {
			if x < 8 {
				img.SetGray(x, y, color.Gray{255})
			}
		}
	}
	j := withEXIF(encodeJPEG(t, img), 6, 0)
	got, err := Shrink(j, Target{}, Limits{})
	if err != nil || !got.Changed || got.Width != 30 || got.Height != 40 {
		t.Fatalf("got %d×%d changed=%v %v; want upright 30×40", got.Width, got.Height, got.Changed, err)
	}
	out, _, err := image.Decode(bytes.NewReader(got.Data))
	if err != nil {
		t.Fatal(err)
	}
	top, bottom := gray(out.At(15, 2)), gray(out.At(15, 37))
	if top < 200 || bottom > 60 {
		t.Fatalf("rotation not applied: top %d, bottom %d", top, bottom)
	}
}

// Every EXIF orientation turns the stored pixels upright as the EXIF
// specification says: a mark in the stored top-left corner is shown
// top-left (1, 5: transposed), top-right (2: mirrored, 6: turned a quarter
// clockwise), bottom-right (3: half a turn, 7: transverse) or bottom-left
// (4: flipped, 8: a quarter anticlockwise), and 5 to 8 swap the sides.
func TestShrinkAppliesEveryEXIFOrientation(t *testing.T) {
	img := image.NewGray(image.Rect(0, 0, 40, 30)) // black, a white 10×10 mark top-left
	for y := range 10 {
		for x := range 10 {
			img.SetGray(x, y, color.Gray{255})
		}
	}
	stored := encodeJPEG(t, img)
	for o, corner := range map[uint16]string{1: "top-left", 2: "top-right", 3: "bottom-right", 4: "bottom-left",
		5: "top-left", 6: "top-right", 7: "bottom-right", 8: "bottom-left"} {
		got, err := Shrink(withEXIF(stored, o, 0), Target{MaxEdge: 39}, Limits{})
		if err != nil {
			t.Fatalf("orientation %d: %v", o, err)
		}
		out, _, err := image.Decode(bytes.NewReader(got.Data))
		if err != nil {
			t.Fatal(err)
		}
		w, h := out.Bounds().Dx(), out.Bounds().Dy()
		if (o >= 5) != (h > w) || got.Width != w || got.Height != h {
			t.Fatalf("orientation %d: %d×%d (reported %d×%d); stored 40×30", o, w, h, got.Width, got.Height)
		}
		corners := map[string]color.Color{"top-left": out.At(2, 2), "top-right": out.At(w-3, 2), "bottom-right": out.At(w-3, h-3), "bottom-left": out.At(2, h-3)}
		for name, c := range corners {
			if white := gray(c) > 200; white != (name == corner) {
				t.Errorf("orientation %d: the %s corner is %d; the mark belongs %s", o, name, gray(c), corner)
			}
		}
	}
}

func encodeJPEG(t *testing.T, img image.Image) []byte {
	var b bytes.Buffer
	if err := jpegEncode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gray(c color.Color) uint8 { return color.GrayModel.Convert(c).(color.Gray).Y }

func TestShrinkRefusesBombsBeforeDecoding(t *testing.T) {
	_, err := Shrink(pngHeader(100000, 100000), Target{}, Limits{})
	wantReason(t, err, reason.TooLarge)
	_, err = Shrink(gifBomb(), Target{}, Limits{})
	wantReason(t, err, reason.TooLarge)
}

func TestShrinkerCachesByRefAndTarget(t *testing.T) {
	s := &Shrinker{MaxEntries: 2}
	src := noisyPNG(t, 1800, 300)
	a, err := s.Shrink(src, Target{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Shrink(src, Target{})
	if &a.Data[0] != &b.Data[0] || s.Len() != 1 {
		t.Fatalf("second shrink of the same (ref, target) was recomputed")
	}
	s.Shrink(src, Target{MaxEdge: 800})
	s.Shrink(src, Target{MaxEdge: 400})
	if s.Len() != 2 {
		t.Fatalf("cache holds %d entries; want its bound, 2", s.Len())
	}
}

func jpegEncode(w *bytes.Buffer, img image.Image) error { return jpegEncodeQ(w, img, 95) }

func jpegEncodeQ(w *bytes.Buffer, img image.Image, q int) error {
	return jpeg.Encode(w, img, &jpeg.Options{Quality: q})
}
