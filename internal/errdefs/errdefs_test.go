package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestCodesRoundTrip(t *testing.T) {
	for _, c := range codes {
		wrapped := fmt.Errorf("op: %w", c.err)
		if got := Code(wrapped); got != c.code {
			t.Errorf("Code(%v) = %q, want %q", wrapped, got, c.code)
		}
		if back := FromCode(c.code); back != c.err {
			t.Errorf("FromCode(%q) = %v, want %v", c.code, back, c.err)
		}
	}
	if Code(errors.New("plain")) != "internal" || FromCode("nonsense") != nil {
		t.Error("unknown errors must be internal, unknown codes nil")
	}
}

func TestNewAndTransitionMatchTheirClass(t *testing.T) {
	if err := New(ErrNotFound, "sandbox %q", "x"); !errors.Is(err, ErrNotFound) || err.Error() != `sandbox "x": not found` {
		t.Errorf("New: %v", err)
	}
	te := &TransitionError{ID: "x", From: "paused", To: "running"}
	if !errors.Is(te, ErrConflict) || Code(fmt.Errorf("wrap: %w", te)) != "conflict" {
		t.Errorf("TransitionError is not a conflict: %v", te)
	}
	var got *TransitionError
	if !errors.As(fmt.Errorf("wrap: %w", te), &got) || got.From != "paused" {
		t.Errorf("TransitionError lost its data")
	}
}
