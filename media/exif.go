package media

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// jpegOrientation returns the EXIF orientation (1-8) of a JPEG, or 0 when
// data is not a JPEG or carries none. It walks the marker segments up to the
// first frame header, bounds-checking every offset.
func jpegOrientation(data []byte) int {
	if len(data) < 4 || data[0] != 0xFF || data[1] != 0xD8 {
		return 0
	}
	for i := 2; i+4 <= len(data); {
		if data[i] != 0xFF {
			return 0
		}
		marker := data[i+1]
		if marker == 0xFF { // fill byte
			i++
			continue
		}
		if marker == 0xDA || (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
			return 0 // start of scan or frame: no EXIF before it
		}
		size := int(binary.BigEndian.Uint16(data[i+2:]))
		if size < 2 || i+2+size > len(data) {
			return 0
		}
		seg := data[i+4 : i+2+size]
		if marker == 0xE1 && len(seg) >= 6 && string(seg[:6]) == "Exif\x00\x00" {
			return tiffOrientation(seg[6:])
		}
		i += 2 + size
	}
	return 0
}

func tiffOrientation(t []byte) int {
	if len(t) < 8 {
		return 0
	}
	var bo binary.ByteOrder
	switch string(t[:4]) {
	case "II*\x00":
		bo = binary.LittleEndian
	case "MM\x00*":
		bo = binary.BigEndian
	default:
		return 0
	}
	ifd := int(bo.Uint32(t[4:]))
	if ifd < 8 || ifd+2 > len(t) {
		return 0
	}
	n := int(bo.Uint16(t[ifd:]))
	for k := 0; k < n; k++ {
		e := ifd + 2 + 12*k
		if e+12 > len(t) {
			return 0
		}
		if bo.Uint16(t[e:]) == 0x0112 && bo.Uint16(t[e+2:]) == 3 { // Orientation, SHORT
			if o := int(bo.Uint16(t[e+8:])); o >= 1 && o <= 8 {
				return o
			}
			return 0
		}
	}
	return 0
}

// jpegHeaderNeed walks a JPEG's marker segments and returns how many bytes
// from the start cover its frame header (SOFn), or, when data ends before
// that, a lower bound on the bytes needed to make progress. ok is false when
// the bytes are not a walkable JPEG.
func jpegHeaderNeed(data []byte) (need int, found, ok bool) {
	if len(data) < 2 || data[0] != 0xFF || data[1] != 0xD8 {
		return 0, false, false
	}
	i := 2
	for {
		if i+4 > len(data) {
			return i + 4, false, true
		}
		if data[i] != 0xFF {
			return 0, false, false
		}
		marker := data[i+1]
		if marker == 0xFF {
			i++
			continue
		}
		size := int(binary.BigEndian.Uint16(data[i+2:]))
		if size < 2 {
			return 0, false, false
		}
		end := i + 2 + size
		if marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC {
			return end, true, true
		}
		if marker == 0xDA {
			return 0, false, false // scan before any frame header
		}
		if end > len(data) {
			return end, false, true
		}
		i = end
	}
}

// jpegSizeFromBase64 reads a JPEG's displayed size straight from its base64
// text without decoding the metadata in front of the frame header: base64
// maps every 4 characters to 3 bytes, so each segment header is decoded at
// its own offset and the segment body skipped. ok is false when the text has
// white space or padding inside, or the walk fails; callers then decode a
// prefix the ordinary way.
func jpegSizeFromBase64(s string) (w, h int, ok bool) {
	at := func(off, n int) []byte { return decodeWindow(s, off, n) }
	if b := at(0, 2); b == nil || b[0] != 0xFF || b[1] != 0xD8 {
		return 0, 0, false
	}
	orientation := 0
	for i, steps := 2, 0; steps < 64; steps++ {
		seg := at(i, 4)
		if seg == nil || seg[0] != 0xFF {
			return 0, 0, false
		}
		marker, size := seg[1], int(seg[2])<<8|int(seg[3])
		if marker == 0xFF {
			i++
			continue
		}
		if size < 2 || marker == 0xDA {
			return 0, 0, false
		}
		if marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC {
			sof := at(i+4, 5) // precision, height, width
			if sof == nil {
				return 0, 0, false
			}
			h, w = int(sof[1])<<8|int(sof[2]), int(sof[3])<<8|int(sof[4])
			if w == 0 || h == 0 {
				return 0, 0, false
			}
			if orientation >= 5 {
				w, h = h, w
			}
			return w, h, true
		}
		if marker == 0xE1 && size <= 64<<10 {
			if app1 := at(i, 2+size); len(app1) > 10 && string(app1[4:10]) == "Exif\x00\x00" {
				orientation = tiffOrientation(app1[10:])
			}
		}
		i += 2 + size
	}
	return 0, 0, false
}

// decodeWindow decodes bytes [off, off+n) of the data base64 text s encodes,
// touching only the characters that hold them. It returns nil when the
// window is past the end or the characters are not plain base64.
func decodeWindow(s string, off, n int) []byte {
	first, last := off/3*4, (off+n+2)/3*4
	if last > len(s) {
		return nil
	}
	chunk := s[first:last]
	for i := 0; i < len(chunk); i++ {
		if c := b64Class[chunk[i]]; c != b64Common && c != b64Std && c != b64URL {
			return nil
		}
	}
	enc := base64.RawStdEncoding
	if strings.ContainsAny(chunk, "-_") {
		enc = base64.RawURLEncoding
	}
	buf := make([]byte, enc.DecodedLen(len(chunk)))
	if _, err := enc.Decode(buf, []byte(chunk)); err != nil {
		return nil
	}
	return buf[off%3 : off%3+n]
}
