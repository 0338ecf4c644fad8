package hutch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash"
	"io"
	"math"
	"time"

	"github.com/hutch-dev/hutch/api"
)

// The lifecycle: a running sandbox can be paused (every process frozen,
// memory kept) or suspended (its whole writable layer kept as an archive;
// processes and memory let go), and resumed from either. A suspended
// sandbox is retired after RetireAfter (only its archive is kept), and can
// still be resumed. Unless AutoResume is off, any call on a paused,
// suspended or retired sandbox resumes it first. A move the state machine
// refuses (resuming a destroyed sandbox, say) is an error matching
// ErrConflict.

// ArchiveInfo describes a suspended sandbox's archive: a zstd-compressed
// tar of its writable layer.
type ArchiveInfo struct {
	Size      int64     `json:"size"`   // compressed bytes
	SHA256    string    `json:"sha256"` // of the compressed bytes, hex
	Bytes     int64     `json:"bytes"`  // uncompressed bytes
	CreatedAt time.Time `json:"created_at"`
}

func fromAPIArchive(a *api.ArchiveInfo) *ArchiveInfo {
	if a == nil {
		return nil
	}
	return &ArchiveInfo{Size: a.Size, SHA256: a.Sha256, Bytes: a.Bytes, CreatedAt: a.CreatedAt}
}

// secondsDuration turns the API's fractional seconds into a Duration.
func secondsDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// lifeSeconds is the wire form of an idle or retire timer: whole seconds
// rounded up, 0 for the default, -1 for never.
func lifeSeconds(d time.Duration) int {
	if d < 0 {
		return -1
	}
	return ceilSeconds(d)
}

// MarshalJSON writes s as the API does, TimeUsed in seconds.
func (s Sandbox) MarshalJSON() ([]byte, error) {
	type plain Sandbox
	return json.Marshal(struct {
		plain
		TimeUsed float64 `json:"time_used"`
	}{plain(s), s.TimeUsed.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes (and the API's Sandbox).
func (s *Sandbox) UnmarshalJSON(b []byte) error {
	type plain Sandbox
	v := struct {
		*plain
		TimeUsed float64 `json:"time_used"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	s.TimeUsed = secondsDuration(v.TimeUsed)
	return nil
}

// Pause freezes every process of the sandbox; its memory stays. Pausing a
// paused sandbox succeeds. s is refreshed and returned.
func (s *Sandbox) Pause(ctx context.Context) (*Sandbox, error) {
	r, err := s.c.api.PauseSandboxWithResponse(ctx, s.ID)
	return s.refreshFrom(s.c.check(r, err), r)
}

// Suspend keeps the sandbox's whole writable layer (every file changed
// anywhere in its root filesystem, not only /workspace) as an archive and
// lets its processes and memory go: they are not kept. An archive over the
// daemon's cap is an error matching ErrResourceExhausted, and the sandbox
// runs on untouched. Suspending a suspended sandbox succeeds. s is
// refreshed and returned.
func (s *Sandbox) Suspend(ctx context.Context) (*Sandbox, error) {
	r, err := s.c.api.SuspendSandboxWithResponse(ctx, s.ID)
	return s.refreshFrom(s.c.check(r, err), r)
}

// Resume brings a paused, suspended or retired sandbox back to running,
// its timers as they were; resuming a running one succeeds. s is refreshed
// and returned.
func (s *Sandbox) Resume(ctx context.Context) (*Sandbox, error) {
	r, err := s.c.api.ResumeSandboxWithResponse(ctx, s.ID)
	return s.refreshFrom(s.c.check(r, err), r)
}

// UpdateOptions change a sandbox's timers live; nil fields stay as they
// are.
type UpdateOptions struct {
	// Timeout is the running time the sandbox may use in all (counted from
	// its creation, paused and suspended time excluded; whole seconds,
	// rounded up) before OnTimeout; 0 = no limit. Raising it extends the
	// sandbox; one already past a lowered timeout is reaped.
	Timeout *time.Duration
	// OnTimeout is "destroy" or "suspend".
	OnTimeout *string
	// IdleTimeout and RetireAfter: 0 = the daemon's default, negative =
	// never.
	IdleTimeout, RetireAfter *time.Duration
	// AutoResume false makes calls on a paused or suspended sandbox fail
	// with ErrConflict instead of resuming it.
	AutoResume *bool
}

// Update changes the sandbox's timers. s is refreshed and returned.
func (s *Sandbox) Update(ctx context.Context, o UpdateOptions) (*Sandbox, error) {
	var req api.UpdateSandboxRequest
	if o.Timeout != nil {
		t := ceilSeconds(*o.Timeout)
		if *o.Timeout < 0 {
			t = -1 // the daemon says why it is refused
		}
		req.Timeout = &t
	}
	if o.OnTimeout != nil {
		ot := api.UpdateSandboxRequestOnTimeout(*o.OnTimeout)
		req.OnTimeout = &ot
	}
	if o.IdleTimeout != nil {
		n := lifeSeconds(*o.IdleTimeout)
		req.IdleTimeout = &n
	}
	if o.RetireAfter != nil {
		n := lifeSeconds(*o.RetireAfter)
		req.RetireAfter = &n
	}
	req.AutoResume = o.AutoResume
	r, err := s.c.api.UpdateSandboxWithResponse(ctx, s.ID, req)
	return s.refreshFrom(s.c.check(r, err), r)
}

// refreshFrom sets s to the sandbox a lifecycle call answered.
func (s *Sandbox) refreshFrom(err error, r interface{ GetJSON200() *api.Sandbox }) (*Sandbox, error) {
	if err != nil {
		return nil, err
	}
	fresh, err := s.c.sandbox(r.GetJSON200())
	if err != nil {
		return nil, err
	}
	*s = *fresh
	return s, nil
}

// DownloadSandboxArchive reads the archive of a suspended or retired
// sandbox: a zstd-compressed tar of its writable layer, owners relative to
// the sandbox. A sandbox never suspended has none (ErrNotFound). The info
// has the size and sha256 the daemon announces (Bytes and CreatedAt too
// when s, as last seen, describes the same archive); the reader checks the
// sha256 and fails at the end of a body that does not match it. Close the
// reader when done.
func (s *Sandbox) DownloadSandboxArchive(ctx context.Context) (io.ReadCloser, ArchiveInfo, error) {
	resp, err := s.c.api.DownloadSandboxArchive(ctx, s.ID)
	if err := s.c.checkHTTP(resp, err); err != nil {
		return nil, ArchiveInfo{}, err
	}
	info := ArchiveInfo{SHA256: resp.Header.Get("X-Hutch-Sha256"), Size: resp.ContentLength}
	if a := s.Archive; a != nil && a.SHA256 == info.SHA256 {
		info.Bytes, info.CreatedAt = a.Bytes, a.CreatedAt
		if info.Size < 0 {
			info.Size = a.Size
		}
	}
	if info.Size < 0 {
		info.Size = 0
	}
	return &verifyReader{rc: resp.Body, h: sha256.New(), want: info.SHA256}, info, nil
}

// verifyReader hashes what it reads and, at EOF, fails unless the digest
// is the one announced.
type verifyReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want string
	err  error
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF && v.want != "" {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
			err = protocolError("archive sha256 %s, announced %s", got, v.want)
		}
	}
	if err != nil {
		v.err = err
	}
	return n, err
}

func (v *verifyReader) Close() error { return v.rc.Close() }
