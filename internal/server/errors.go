package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/hutch-dev/hutch/api"
	"github.com/hutch-dev/hutch/internal/errdefs"
)

// apiError is the error body for err; internal errors get a generic message
// (the cause is logged, never sent).
func (s *Server) apiError(r *http.Request, err error) (int, api.Error) {
	status := errdefs.HTTPStatus(err)
	body := api.Error{Code: errdefs.Code(err), Message: err.Error(), RequestId: requestID(r.Context())}
	var te *errdefs.TransitionError
	if errors.As(err, &te) {
		body.From, body.To = te.From, te.To
	}
	if status == http.StatusInternalServerError {
		body.Message = "internal error; see the daemon's log for request " + body.RequestId
		s.log.Error("internal error", "request_id", body.RequestId, "method", r.Method, "path", r.URL.Path, "err", err)
	}
	return status, body
}

// fail writes err as the API's error body.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, body := s.apiError(r, err)
	s.metrics.errors.WithLabelValues(body.Code).Inc()
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, format, args...)
}

func notFound(format string, args ...any) error {
	return errdefs.New(errdefs.ErrNotFound, format, args...)
}

// decode reads a JSON object into v: at most max bytes, no unknown
// fields, nothing after the value. Every request body of the API is an
// object; null, which encoding/json would take as "all defaults", is not.
func decode(w http.ResponseWriter, r *http.Request, max int64, v any) error {
	body := bufio.NewReader(http.MaxBytesReader(w, r.Body, max))
	if err := wantObject(body); err != nil {
		return bodyError(err, max)
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err, max)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("request body: unexpected data after the JSON value")
	}
	return nil
}

var errNotObject = invalid("request body must be a JSON object")

// wantObject checks, without consuming it, that the first byte after any
// white space opens an object.
func wantObject(br *bufio.Reader) error {
	for {
		b, err := br.ReadByte()
		if err != nil {
			return err
		}
		switch b {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return br.UnreadByte()
		}
		return errNotObject
	}
}

func bodyError(err error, max int64) error {
	var tooBig *http.MaxBytesError
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, errNotObject):
		return err
	case errors.As(err, &tooBig):
		return errdefs.New(errdefs.ErrTooLarge, "request body is over %d bytes", max)
	case errors.Is(err, io.EOF):
		return invalid("request body is empty; a JSON object was expected")
	case errors.As(err, &syn):
		return invalid("request body is not valid JSON at byte %d: %v", syn.Offset, err)
	case errors.As(err, &typ):
		return invalid("request body: field %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
	}
	// Unknown fields among them: encoding/json has no typed error for it.
	return invalid("request body: %v", err)
}
