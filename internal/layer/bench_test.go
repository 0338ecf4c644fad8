package layer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// smallTree makes 40 directories of 50 files of 0.5-4 KiB (2000 files),
// the shape of an apt-installed package set.
func smallTree(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	must(b, os.Chown(dir, baseA, baseA))
	rng := rand.New(rand.NewPCG(3, 4))
	words := []string{"lib", "usr", "share", "doc", "copyright", "0.1.2", "amd64", "\n", "=", "#"}
	for d := range 40 {
		sub := filepath.Join(dir, fmt.Sprintf("pkg%02d", d))
		must(b, os.Mkdir(sub, 0o755))
		must(b, os.Chown(sub, baseA, baseA))
		for f := range 50 {
			var body bytes.Buffer
			for body.Len() < 512+rng.IntN(3584) {
				body.WriteString(words[rng.IntN(len(words))])
			}
			p := filepath.Join(sub, fmt.Sprintf("file%03d", f))
			must(b, os.WriteFile(p, body.Bytes(), 0o644))
			must(b, os.Chown(p, baseA, baseA))
		}
	}
	return dir
}

func BenchmarkPack(b *testing.B) {
	needRoot(b)
	dir := smallTree(b)
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		st, err := Pack(context.Background(), &buf, dir, baseA, idRange)
		must(b, err)
		b.SetBytes(st.Bytes)
	}
}

func BenchmarkUnpack(b *testing.B) {
	needRoot(b)
	archive, st := pack(b, smallTree(b), baseA)
	b.SetBytes(st.Bytes)
	out := b.TempDir()
	for i := 0; b.Loop(); i++ {
		dst := filepath.Join(out, fmt.Sprint(i))
		must(b, os.Mkdir(dst, 0o700))
		_, err := Unpack(context.Background(), bytes.NewReader(archive), dst, baseB, idRange, 1<<30)
		must(b, err)
	}
}

// BenchmarkPackUnpack is one suspend plus resume of the tree.
func BenchmarkPackUnpack(b *testing.B) {
	needRoot(b)
	dir := smallTree(b)
	out := b.TempDir()
	var buf bytes.Buffer
	for i := 0; b.Loop(); i++ {
		buf.Reset()
		st, err := Pack(context.Background(), &buf, dir, baseA, idRange)
		must(b, err)
		dst := filepath.Join(out, fmt.Sprint(i))
		must(b, os.Mkdir(dst, 0o700))
		_, err = Unpack(context.Background(), &buf, dst, baseB, idRange, 1<<30)
		must(b, err)
		b.SetBytes(st.Bytes)
	}
}

func BenchmarkCopy(b *testing.B) {
	needRoot(b)
	dir := smallTree(b)
	out := b.TempDir()
	for i := 0; b.Loop(); i++ {
		st, err := Copy(context.Background(), dir, filepath.Join(out, fmt.Sprint(i)), baseA, 0, idRange)
		must(b, err)
		b.SetBytes(st.Bytes)
	}
}
