package store

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAuthenticate is the per-request cost of an API call's auth: a
// hash and one indexed read (last_used is written at most once a minute).
func BenchmarkAuthenticate(b *testing.B) {
	s, _ := openTest(b)
	ctx := context.Background()
	var secret string
	for i := range 100 { // a realistic table, not a single row
		_, sec, err := s.CreateKey(ctx, fmt.Sprint(i), "", nil)
		if err != nil {
			b.Fatal(err)
		}
		secret = sec
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Authenticate(ctx, secret); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Authenticate(ctx, secret); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkGetSandbox(b *testing.B) {
	s, _ := openTest(b)
	ctx := context.Background()
	for i := range 1000 {
		sb := newSandbox(fmt.Sprintf("sb_%04d", i), fmt.Sprintf("t%d", i%10))
		if _, err := s.InsertSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.GetSandbox(ctx, "t7", "sb_0507"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.GetSandbox(ctx, "t7", "sb_0507"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkUpdateSandbox is the write path through the single writer.
func BenchmarkUpdateSandbox(b *testing.B) {
	s, _ := openTest(b)
	ctx := context.Background()
	sb, err := s.InsertSandbox(ctx, newSandbox("sb_1", "t"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if sb, err = s.UpdateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
}
