package hutch

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

// The error classes, shared with the daemon: errors.Is(err, ErrNotFound)
// holds for an SDK error exactly when it held for the server's.
var (
	ErrNotFound           = errdefs.ErrNotFound
	ErrAlreadyExists      = errdefs.ErrAlreadyExists
	ErrInvalidArgument    = errdefs.ErrInvalidArgument
	ErrFailedPrecondition = errdefs.ErrFailedPrecondition
	ErrConflict           = errdefs.ErrConflict
	ErrResourceExhausted  = errdefs.ErrResourceExhausted
	ErrPermissionDenied   = errdefs.ErrPermissionDenied
	ErrUnauthenticated    = errdefs.ErrUnauthenticated
	ErrNotImplemented     = errdefs.ErrNotImplemented
	ErrUnavailable        = errdefs.ErrUnavailable
	ErrDeadlineExceeded   = errdefs.ErrDeadlineExceeded
	ErrTooLarge           = errdefs.ErrTooLarge
)

// Error is an error answered by the daemon: a non-2xx response, or an error
// event inside a stream.
type Error struct {
	Status    int    // HTTP status; 0 for an error event in a stream
	Code      string // the API's code, e.g. "not_found"; "internal" when unknown
	Message   string
	RequestID string
	// From and To name the states of a refused state change (Code
	// "conflict", e.g. exec on a paused sandbox created without
	// auto-resume); empty otherwise.
	From, To string
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	if e.Code != "" {
		return e.Code
	}
	return http.StatusText(e.Status)
}

// Unwrap returns the sentinel of e's code (nil for "internal" and unknown
// codes), so errors.Is(err, ErrNotFound) works.
func (e *Error) Unwrap() error { return errdefs.FromCode(e.Code) }

// statusCodes guesses a code from a status when the body has none (a
// proxy's answer, say).
var statusCodes = map[int]string{
	http.StatusBadRequest: "invalid_argument", http.StatusUnauthorized: "unauthenticated",
	http.StatusForbidden: "permission_denied", http.StatusNotFound: "not_found",
	http.StatusConflict: "conflict", http.StatusPreconditionFailed: "failed_precondition",
	http.StatusRequestEntityTooLarge: "payload_too_large", http.StatusTooManyRequests: "resource_exhausted",
	http.StatusNotImplemented: "not_implemented", http.StatusServiceUnavailable: "unavailable",
	http.StatusGatewayTimeout: "deadline_exceeded",
}

// errorFromBody builds the *Error of a non-2xx response.
func errorFromBody(status int, body []byte, header http.Header) *Error {
	e := &Error{Status: status}
	var wire struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
		From      string `json:"from"`
		To        string `json:"to"`
	}
	if json.Unmarshal(body, &wire) == nil && wire.Code != "" {
		e.Code, e.Message, e.RequestID, e.From, e.To = wire.Code, wire.Message, wire.RequestID, wire.From, wire.To
	} else {
		e.Code = statusCodes[status]
		if e.Code == "" {
			e.Code = "internal"
		}
		e.Message = fmt.Sprintf("%s: %s", http.StatusText(status), truncate(string(body), 200))
	}
	if e.RequestID == "" && header != nil {
		e.RequestID = header.Get("X-Request-Id")
	}
	return e
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// connError is a daemon that could not be reached; it matches
// ErrUnavailable and the underlying network error.
type connError struct {
	host string
	err  error
}

func (e *connError) Error() string {
	return fmt.Sprintf("cannot reach the hutch daemon at %s: %v", e.host, e.err)
}

func (e *connError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// transportErr classifies an error from the HTTP round trip: a failed dial
// becomes a connError; everything else (a cancelled context, say) is kept.
func (c *Client) transportErr(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &connError{host: c.host, err: op.Err}
	}
	return err
}

// protocolError reports a response that breaks the contract.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("hutch: unexpected response: "+format, args...)
}
