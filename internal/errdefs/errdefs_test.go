package errdefs

import (
	"context"
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

// A context's end is not an internal error: a deadline is
// deadline_exceeded (504), a cancellation (the caller went away)
// unavailable (503); both also when wrapped.
func TestContextErrors(t *testing.T) {
	for err, want := range map[error]string{
		context.DeadlineExceeded:                            "deadline_exceeded",
		fmt.Errorf("store: insert: %w", context.Canceled):   "unavailable",
		fmt.Errorf("exec: %w", context.DeadlineExceeded):    "deadline_exceeded",
		errors.New("something else"):                        "internal",
		fmt.Errorf("%w: %w", ErrNotFound, context.Canceled): "not_found",
	} {
		if got := Code(err); got != want {
			t.Errorf("Code(%v) = %s, want %s", err, got, want)
		}
	}
	if HTTPStatus(context.Canceled) != 503 || HTTPStatus(context.DeadlineExceeded) != 504 {
		t.Error("HTTPStatus of context errors")
	}
}
