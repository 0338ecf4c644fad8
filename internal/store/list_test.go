package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

var states = []string{"creating", "running", "stopped", "failed"}

// fill inserts n sandboxes across 3 tenants and 4 states. IDs are a
// permutation of the insertion order and created times repeat in threes, so
// the (created, id) order is exercised on both columns.
func fill(t testing.TB, s *Store, clk *clock, n int) []Sandbox {
	t.Helper()
	ctx := context.Background()
	var all []Sandbox
	for i := range n {
		if i%3 == 0 {
			clk.advance(time.Millisecond)
		}
		sb := Sandbox{
			ID:     fmt.Sprintf("sb_%04d", (i*37)%n),
			Tenant: fmt.Sprintf("t%d", i%3),
			State:  states[i%4],
			Spec:   []byte(`{}`),
		}
		if i%7 != 0 {
			sb.Labels = map[string]string{"parity": []string{"even", "odd"}[i%2], "mod5": fmt.Sprint(i % 5)}
		}
		all = append(all, must[Sandbox](t)(s.InsertSandbox(ctx, sb)))
	}
	return all
}

// matches is the filter evaluated in Go, to check the SQL against.
func matches(f ListFilter, sb Sandbox) bool {
	if f.Tenant != "" && sb.Tenant != f.Tenant {
		return false
	}
	if len(f.States) > 0 && !slices.Contains(f.States, sb.State) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := sb.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func expected(all []Sandbox, f ListFilter) []string {
	var ids []string
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b Sandbox) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, sb := range sorted {
		if matches(f, sb) {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// pageAll follows page tokens to the end and returns every ID in order.
func pageAll(t *testing.T, s *Store, f ListFilter) (ids []string, pages int) {
	t.Helper()
	for {
		page, next := must2List(t)(s.ListSandboxes(context.Background(), f))
		pages++
		for _, sb := range page {
			if !matches(f, sb) {
				t.Fatalf("%+v does not match the filter", sb)
			}
			ids = append(ids, sb.ID)
		}
		if next == "" {
			return ids, pages
		}
		if len(page) == 0 {
			t.Fatal("an empty page with a next token")
		}
		f.PageToken = next
		if pages > 1000 {
			t.Fatal("pagination does not end")
		}
	}
}

func TestListPagination(t *testing.T) {
	s, _ := openTest(t)
	all := fill(t, s, newClock(s), 250)
	filters := []ListFilter{
		{},
		{Tenant: "t1"},
		{States: []string{"running", "failed"}},
		{Labels: map[string]string{"parity": "even"}},
		{Tenant: "t2", States: []string{"running", "stopped", "creating"}, Labels: map[string]string{"parity": "even", "mod5": "3"}},
		{Labels: map[string]string{"nope": "x"}},
		{Tenant: "nobody"},
	}
	for _, limit := range []int{1, 7, 40, 50, 1000} {
		for _, f := range filters {
			f.Limit = limit
			want := expected(all, f)
			got, pages := pageAll(t, s, f)
			if !slices.Equal(got, want) {
				t.Fatalf("filter %+v: got %d ids %v\nwant %d ids %v", f, len(got), got, len(want), want)
			}
			// Exactly as many pages as needed: a full last page has no
			// empty page after it.
			if wantPages := max(1, (len(want)+limit-1)/limit); pages != wantPages {
				t.Errorf("filter %+v: %d pages, want %d", f, pages, wantPages)
			}
		}
	}
	page, next := must2List(t)(s.ListSandboxes(context.Background(), ListFilter{}))
	if len(page) != 100 || next == "" {
		t.Fatalf("default limit: %d rows, next %q", len(page), next)
	}
}

// Keyset pages do not shift when rows come and go between them.
func TestListStableUnderChanges(t *testing.T) {
	s, _ := openTest(t)
	clk := newClock(s)
	ctx := context.Background()
	all := fill(t, s, clk, 100)
	order := expected(all, ListFilter{})
	page, next := must2List(t)(s.ListSandboxes(ctx, ListFilter{Limit: 30}))
	seen := map[string]int{}
	for _, sb := range page {
		seen[sb.ID]++
	}
	// Delete one row already returned and one still to come; add one.
	must0(t, s.DeleteSandbox(ctx, order[0]))
	must0(t, s.DeleteSandbox(ctx, order[50]))
	clk.advance(time.Second)
	must[Sandbox](t)(s.InsertSandbox(ctx, Sandbox{ID: "sb_late", Tenant: "t0", State: "creating"}))
	for next != "" {
		page, next = must2List(t)(s.ListSandboxes(ctx, ListFilter{Limit: 30, PageToken: next}))
		for _, sb := range page {
			seen[sb.ID]++
		}
	}
	for _, id := range append(order, "sb_late") {
		want := 1
		if id == order[50] {
			want = 0
		}
		if seen[id] != want {
			t.Errorf("%s seen %d times, want %d", id, seen[id], want)
		}
	}
}

func TestListInvalid(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	tok := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	bad := []ListFilter{
		{Limit: -1},
		{Limit: 1001},
		{PageToken: "!!!"},
		{PageToken: "===="},
		{PageToken: "AA"},
		{PageToken: tok([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1, 'x'})}, // unknown version
		{PageToken: tok([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1})},      // no id
		{PageToken: strings.Repeat("A", maxTokenLen+4)},
		{States: make([]string, maxTerms+1)},
	}
	for _, f := range bad {
		_, _, err := s.ListSandboxes(ctx, f)
		if !errorsIsInvalid(err) {
			t.Errorf("filter %+v: error = %v, want invalid argument", f, err)
		}
	}
	if _, _, err := s.ListSandboxes(ctx, ListFilter{Limit: 1000}); err != nil {
		t.Errorf("limit 1000: %v", err)
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	for _, c := range []struct {
		created int64
		id      string
	}{{0, "a"}, {-1, "sb_1"}, {time.Now().UnixNano(), "ünïcode/and?odd#chars"}, {1 << 62, strings.Repeat("x", 300)}} {
		created, id, err := decodePageToken(encodePageToken(c.created, c.id))
		if err != nil || created != c.created || id != c.id {
			t.Errorf("round trip of (%d, %q) = (%d, %q), %v", c.created, c.id, created, id, err)
		}
	}
}

func errorsIsInvalid(err error) bool { return err != nil && errors.Is(err, errdefs.ErrInvalidArgument) }

func must0(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
