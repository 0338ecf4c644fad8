// Package errdefs is hutch's one error vocabulary. Every layer wraps one of
// these sentinels with context (fmt.Errorf("...: %w", errdefs.ErrNotFound))
// and only the edges (the HTTP server, the SDK) turn them into wire codes.
// Callers test with errors.Is; error strings are never matched.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// The error classes. Each maps to one wire code and one HTTP status.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrConflict           = errors.New("conflict")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrNotImplemented     = errors.New("not implemented")
	ErrUnavailable        = errors.New("unavailable")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrTooLarge           = errors.New("payload too large")
)

// codes lists the sentinels with their wire codes, in match order.
var codes = []struct {
	err  error
	code string
}{
	{ErrNotFound, "not_found"},
	{ErrAlreadyExists, "already_exists"},
	{ErrInvalidArgument, "invalid_argument"},
	{ErrFailedPrecondition, "failed_precondition"},
	{ErrConflict, "conflict"},
	{ErrResourceExhausted, "resource_exhausted"},
	{ErrPermissionDenied, "permission_denied"},
	{ErrUnauthenticated, "unauthenticated"},
	{ErrNotImplemented, "not_implemented"},
	{ErrUnavailable, "unavailable"},
	{ErrDeadlineExceeded, "deadline_exceeded"},
	{ErrTooLarge, "payload_too_large"},
}

// Code returns the wire code of err's class, or "internal" when err belongs
// to none.
func Code(err error) string {
	var te *TransitionError
	if errors.As(err, &te) {
		return "conflict"
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		// The caller went away (or the daemon is stopping): nothing
		// broke, and the answer will most likely never be read.
		return "unavailable"
	}
	return "internal"
}

// FromCode returns the sentinel for a wire code, or nil for an unknown code.
func FromCode(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// New wraps a sentinel with a formatted message: New(ErrNotFound, "sandbox %q", id).
func New(class error, format string, args ...any) error {
	return &classed{class: class, msg: fmt.Sprintf(format, args...)}
}

type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg + ": " + e.class.Error() }
func (e *classed) Unwrap() error { return e.class }

// TransitionError reports a state change that the current state forbids. It
// is a Conflict.
type TransitionError struct {
	ID       string
	From, To string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("sandbox %s: cannot go from %s to %s", e.ID, e.From, e.To)
}

// Unwrap makes a TransitionError match ErrConflict.
func (e *TransitionError) Unwrap() error { return ErrConflict }

// HTTPStatus is the one mapping of the error vocabulary to HTTP status
// codes, used by every HTTP edge (hutch's API, the E2B API and envd):
// anything outside the vocabulary is 500.
func HTTPStatus(err error) int {
	switch Code(err) {
	case "invalid_argument":
		return http.StatusBadRequest
	case "unauthenticated":
		return http.StatusUnauthorized
	case "permission_denied":
		return http.StatusForbidden
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "conflict":
		return http.StatusConflict
	case "failed_precondition":
		return http.StatusPreconditionFailed
	case "payload_too_large":
		return http.StatusRequestEntityTooLarge
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "not_implemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
