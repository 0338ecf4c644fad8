package crashtest

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hutch-dev/hutch/internal/blob"
	"github.com/hutch-dev/hutch/internal/store"
)

// rig is one data directory and the daemon currently serving it. Its
// cleanup destroys every sandbox through a fresh daemon and checks that
// no init, cgroup or temporary file is left.
type rig struct {
	t    *testing.T
	data string
	log  *syncBuffer
	d    *daemon
}

func newRig(t *testing.T) *rig {
	requireRoot(t)
	r := &rig{t: t, data: dataDir(t), log: &syncBuffer{}}
	t.Cleanup(r.cleanup)
	return r
}

func (r *rig) start(args ...string) *daemon {
	r.t.Helper()
	r.d = start(r.t, r.data, r.log, args...)
	return r.d
}

// crash kills the daemon with SIGKILL.
func (r *rig) crash() {
	r.d.kill()
	r.d = nil
}

// stop stops the daemon gracefully.
func (r *rig) stop() {
	r.d.stop()
	r.d = nil
}

func (r *rig) cleanup() {
	t := r.t
	if r.d != nil {
		r.d.kill()
	}
	d := start(t, r.data, r.log)
	for _, sb := range d.list() {
		if st, raw := d.try("DELETE", "/v1/sandboxes/"+sb.ID, nil); st != 204 {
			t.Errorf("cleanup: delete %s: %d %s", sb.ID, st, raw)
		}
	}
	d.stop()
	// Nothing of the data directory may run on: the daemon is stopped, its
	// pool's inits are killed, every sandbox is destroyed.
	deadline := time.Now().Add(5 * time.Second)
	for len(inits()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range inits() {
		cmdline, _ := os.ReadFile("/proc/" + itoa(pid) + "/cmdline")
		t.Errorf("cleanup: process %d (%q) runs on after every sandbox was destroyed; killing it", pid, cmdline)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(50 * time.Millisecond)
	// A daemon killed with parked inits (or with an init it had not yet
	// recorded) leaves their cgroups, empty once those inits end by
	// themselves; a later daemon reuses one only if it parks on the same
	// slot. A known leak (reported): removed here, not failed on.
	for _, cg := range leftCgroups(r.data) {
		if err := syscall.Rmdir(cg); err != nil {
			t.Errorf("cleanup: cgroup %s is left behind and cannot be removed: %v", cg, err)
		} else {
			t.Logf("cleanup: removed cgroup %s, left empty by a killed daemon", cg)
		}
	}
	if t.Failed() {
		t.Logf("daemon logs:\n%s", r.log)
	}
	if err := os.RemoveAll(r.data); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// record is a sandbox as the store has it, with its lifecycle data (the
// part of the manager's Timers the tests read).
type record struct {
	store.Sandbox
	Timers timers
}

type timers struct {
	Archive *struct {
		Key    string `json:"key"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	} `json:"archive"`
}

// verify checks the store and the archives while no daemon runs: no
// sandbox is stuck creating, a failed one has a reason, a suspended or
// retired one has an archive, every archive a record names reads to its
// end with its recorded sha256, and no temporary blob is left.
func (r *rig) verify() map[string]record {
	t := r.t
	t.Helper()
	if r.d != nil {
		t.Fatal("verify needs the daemon stopped")
	}
	// First, before blob.NewDir here could tidy anything up.
	if tmp := tempArchives(r.data); len(tmp) > 0 {
		t.Errorf("temporary blobs left in the archive store after recovery: %v", tmp)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(r.data, "hutch.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blobs, err := blob.NewDir(filepath.Join(r.data, "archives"))
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := st.ListSandboxes(ctx, store.ListFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]record{}
	for _, rec := range recs {
		var tm timers
		if len(rec.Extra) > 0 {
			if err := json.Unmarshal(rec.Extra, &tm); err != nil {
				t.Errorf("%s: lifecycle data: %v", rec.ID, err)
			}
		}
		out[rec.ID] = record{rec, tm}
		switch rec.State {
		case "creating":
			t.Errorf("%s is stuck creating after a restart", rec.ID)
		case "failed":
			if rec.Reason == "" {
				t.Errorf("%s failed without a reason", rec.ID)
			}
		case "suspended", "retired":
			if tm.Archive == nil {
				t.Errorf("%s is %s without an archive", rec.ID, rec.State)
			}
		}
		if tm.Archive == nil || rec.State == "destroyed" {
			continue // a destroyed sandbox's archive is deleted with it
		}
		rc, info, err := blobs.Open(ctx, tm.Archive.Key)
		if err != nil {
			t.Errorf("%s (%s): archive %s: %v", rec.ID, rec.State, tm.Archive.Key, err)
			continue
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != tm.Archive.Size || info.SHA256 != tm.Archive.SHA256 {
			t.Errorf("%s (%s): archive %s is corrupt: read %d of %d bytes, sha256 %s (record %s): %v",
				rec.ID, rec.State, tm.Archive.Key, n, tm.Archive.Size, info.SHA256, tm.Archive.SHA256, err)
		}
	}
	return out
}
