package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hutch-dev/hutch/internal/errdefs"
)

func TestOpenFromEmpty(t *testing.T) {
	s, path := openTest(t)
	ctx := context.Background()
	if v, err := userVersion(ctx, s.r); err != nil || v != len(migrations) {
		t.Fatalf("user_version = %d, %v; want %d", v, err, len(migrations))
	}
	for _, table := range []string{"api_keys", "sandboxes", "sandbox_labels"} {
		var n int
		err := s.r.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, table).Scan(&n)
		if err != nil || n != 1 {
			t.Errorf("table %s: count %d, %v", table, n, err)
		}
	}
	pragmas := map[string]string{"journal_mode": "wal", "foreign_keys": "1", "synchronous": "1", "busy_timeout": "5000"}
	for name, want := range pragmas {
		var got string
		if err := s.w.QueryRow("PRAGMA " + name).Scan(&got); err != nil || got != want {
			t.Errorf("writer PRAGMA %s = %q, %v; want %q", name, got, err, want)
		}
	}
	if n := s.w.Stats().MaxOpenConnections; n != 1 {
		t.Errorf("writer MaxOpenConnections = %d, want 1", n)
	}
	// The key hashes are in this file and in the WAL: nobody else reads them.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}

func TestOpenTightensMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hutch.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestReadPoolIsReadOnly(t *testing.T) {
	s, _ := openTest(t)
	if _, err := s.r.Exec(`DELETE FROM api_keys`); err == nil {
		t.Fatal("a write through the read pool succeeded")
	}
}

func TestReopenKeepsData(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "hutch.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	k, secret, err := s.CreateKey(ctx, "ci", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := s.InsertSandbox(ctx, Sandbox{ID: "sb1", Tenant: k.Tenant, State: "running",
		Spec: []byte(`{"image":"host"}`), Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Authenticate(ctx, secret); err != nil || got.ID != k.ID {
		t.Fatalf("Authenticate after reopen = %+v, %v", got, err)
	}
	got, err := s.GetSandbox(ctx, k.Tenant, "sb1")
	if err != nil || string(got.Spec) != string(sb.Spec) || got.Labels["a"] != "b" || got.Version != 1 {
		t.Fatalf("GetSandbox after reopen = %+v, %v", got, err)
	}
	if v, _ := userVersion(ctx, s.r); v != len(migrations) {
		t.Fatalf("user_version after reopen = %d", v)
	}
}

// A database from a newer hutch is refused and not modified at all: not
// migrated, not even switched to WAL.
func TestRefusesNewerVersion(t *testing.T) {
	for _, wal := range []bool{true, false} {
		t.Run(fmt.Sprintf("wal=%v", wal), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hutch.db")
			if wal {
				s, err := Open(context.Background(), path)
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
			}
			db := rawDB(t, path)
			if _, err := db.Exec(fmt.Sprintf(`CREATE TABLE IF NOT EXISTS future (x); PRAGMA user_version = %d`, len(migrations)+1)); err != nil {
				t.Fatal(err)
			}
			db.Close()
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(context.Background(), path)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted a newer database")
			}
			wantErr(t, err, errdefs.ErrFailedPrecondition)
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Fatal("the refused database file changed")
			}
		})
	}
}

func TestRefusesNonDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hutch.db")
	junk := bytes.Repeat([]byte("not a database "), 512)
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), path)
	wantErr(t, err, errdefs.ErrFailedPrecondition)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, junk) {
		t.Fatal("the refused file changed")
	}
}

// A failing migration leaves the database at the previous version with
// none of the failed migration's changes; the next run picks up from there.
func TestMigrationsStepwiseAndAtomic(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	db := rawDB(t, path)
	db.SetMaxOpenConns(1)
	migs := []string{
		`CREATE TABLE a (x INTEGER)`,
		`CREATE TABLE b (x INTEGER); INSERT INTO nonexistent VALUES (1)`,
	}
	if err := migrate(ctx, db, migs); err == nil {
		t.Fatal("a failing migration succeeded")
	}
	if v, _ := userVersion(ctx, db); v != 1 {
		t.Fatalf("version after failed migration 2 = %d, want 1", v)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'b'`).Scan(&n)
	if n != 0 {
		t.Fatal("the failed migration's table b survived")
	}
	migs[1] = `CREATE TABLE b (x INTEGER)`
	if err := migrate(ctx, db, migs); err != nil {
		t.Fatal(err)
	}
	if v, _ := userVersion(ctx, db); v != 2 {
		t.Fatalf("version = %d, want 2", v)
	}
	wantErr(t, migrate(ctx, db, migs[:1]), errdefs.ErrFailedPrecondition)
}

// The hot paths must stay index lookups as the tables grow.
func TestQueryPlans(t *testing.T) {
	s, _ := openTest(t)
	listSQL, listArgs, err := listQuery(ListFilter{Tenant: "t", Labels: map[string]string{"k": "v"}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, query string
		args        []any
		want        []string
	}{
		{"authenticate", keyByHashSQL, []any{[]byte("x")},
			[]string{"USING INDEX sqlite_autoindex_api_keys"}},
		{"get", sandboxByIDSQL, []any{"x", "t"},
			[]string{"USING INDEX sqlite_autoindex_sandboxes"}},
		{"list by tenant and label", listSQL, listArgs,
			[]string{"sandboxes_tenant_created", "sandbox_labels_kv"}},
	}
	for _, c := range cases {
		rows, err := s.r.Query(`EXPLAIN QUERY PLAN `+c.query, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(detail + "\n")
		}
		rows.Close()
		for _, w := range c.want {
			if !strings.Contains(plan.String(), w) {
				t.Errorf("%s: plan does not use %s:\n%s", c.name, w, plan.String())
			}
		}
		if strings.Contains(plan.String(), "SCAN sandboxes") || strings.Contains(plan.String(), "SCAN api_keys") {
			t.Errorf("%s: plan scans a table:\n%s", c.name, plan.String())
		}
	}
}
