package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/api"
)

// A caller's reason for a destroy is kept in the record; a bad one is
// refused and destroys nothing.
func TestDeleteReason(t *testing.T) {
	t.Parallel()
	c := local(t, shared(t))
	var sb api.Sandbox
	c.mustJSON("POST", "/v1/sandboxes", api.CreateSandboxRequest{}, http.StatusCreated, &sb)
	checkErr(t, "long reason", c.do("DELETE", sbPath(sb.Id, "?reason="+strings.Repeat("x", 201)), nil), "invalid_argument")
	checkErr(t, "control character", c.do("DELETE", sbPath(sb.Id, "?reason=a%0Ab"), nil), "invalid_argument")
	var still api.Sandbox
	c.mustJSON("GET", sbPath(sb.Id, ""), nil, http.StatusOK, &still)
	if still.State != api.Running {
		t.Fatalf("a refused delete changed the sandbox: %s", still.State)
	}
	if r := c.do("DELETE", sbPath(sb.Id, "?reason="+q("session completed")), nil); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %s", r)
	}
	var gone api.Sandbox
	c.mustJSON("GET", sbPath(sb.Id, ""), nil, http.StatusOK, &gone)
	if gone.State != api.Destroyed || gone.Reason != "deleted: session completed" {
		t.Fatalf("after delete: %s %q", gone.State, gone.Reason)
	}
}
