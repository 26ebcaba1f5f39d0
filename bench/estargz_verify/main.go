// Reads an eStargz blob with the stargz snapshotter's own reader (package estargz) and checks it
// as the snapshotter does: the footer and TOC, the TOC digest against the layer annotation's value,
// every chunk of every file against its chunkDigest (gunzipped from its own offset), and each
// file's content against its digest. Prints the prefetch landmark's offset. zstd:chunked blobs
// too: the reader is opened with the snapshotter's zstdchunked decompressor, as fs/layer does.
//
// Debian 12's golang-github-containerd-stargz-snapshotter-dev (0.12.0) in GOPATH mode:
//   GOPATH=/usr/share/gocode GO111MODULE=off go build -o /tmp/estargz-verify bench/estargz_verify/main.go
//   /tmp/estargz-verify BLOB sha256:TOC_DIGEST
// (0.14.3: put that tag's estargz/ first on GOPATH.)
package main

import (
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/containerd/stargz-snapshotter/estargz/zstdchunked"
	digest "github.com/opencontainers/go-digest"
)

func check(err error) {
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func main() {
	f, err := os.Open(os.Args[1])
	check(err)
	st, _ := f.Stat()
	sr := io.NewSectionReader(f, 0, st.Size())
	r, err := estargz.Open(sr, estargz.WithDecompressors(new(zstdchunked.Decompressor)))
	check(err)
	v, err := r.VerifyTOC(digest.Digest(os.Args[2]))
	check(err)
	files, chunks, bytes := 0, 0, int64(0)
	var walk func(dir string, e *estargz.TOCEntry)
	walk = func(dir string, e *estargz.TOCEntry) {
		e.ForeachChild(func(base string, c *estargz.TOCEntry) bool {
			name := path.Join(dir, base)
			if c.Type == "dir" {
				walk(name, c)
				return true
			}
			if c.Type != "reg" {
				return true
			}
			files++
			for off := int64(0); off < c.Size; {
				ce, ok := r.ChunkEntryForOffset(name, off)
				if !ok {
					check(fmt.Errorf("%s: no chunk at %d", name, off))
				}
				section := io.NewSectionReader(sr, ce.Offset, ce.NextOffset()-ce.Offset)
				var zr io.Reader
				magic := make([]byte, 2)
				_, err := section.ReadAt(magic, 0)
				check(err)
				if magic[0] == 0x1f && magic[1] == 0x8b {
					zr, err = gzip.NewReader(section)
				} else {
					zr, err = new(zstdchunked.Decompressor).Reader(section)
				}
				check(err)
				data := make([]byte, ce.ChunkSize)
				_, err = io.ReadFull(zr, data)
				check(err)
				ver, err := v.Verifier(ce)
				check(err)
				ver.Write(data)
				if !ver.Verified() {
					check(fmt.Errorf("%s: chunk at %d not verified", name, off))
				}
				chunks++
				off += ce.ChunkSize
			}
			fr, err := r.OpenFile(name)
			check(err)
			h := sha256.New()
			n, err := io.Copy(h, fr)
			check(err)
			bytes += n
			if c.Digest != "" && digest.NewDigest("sha256", h).String() != c.Digest {
				check(fmt.Errorf("%s: content digest mismatch", name))
			}
			return true
		})
	}
	root, ok := r.Lookup("")
	if !ok {
		check(fmt.Errorf("no root"))
	}
	walk("", root)
	if e, ok := r.Lookup(estargz.PrefetchLandmark); ok {
		fmt.Println("prefetch landmark offset", e.Offset)
	}
	if _, ok := r.Lookup(estargz.NoPrefetchLandmark); ok {
		fmt.Println("no-prefetch landmark")
	}
	fmt.Printf("OK: %d files, %d chunks verified, %d bytes read\n", files, chunks, bytes)
}
