package sandbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/store"
)

// recoverAll re-attaches every live sandbox after a (re)start. What cannot
// be recovered is marked failed with the reason; nothing is destroyed.
func (m *Manager) recoverAll(ctx context.Context) error {
	token := ""
	for {
		recs, next, err := m.st.ListSandboxes(ctx, store.ListFilter{
			States: []string{string(Creating), string(Running), string(Paused)}, Limit: 1000, PageToken: token})
		if err != nil {
			return err
		}
		for _, rec := range recs {
			m.recoverOne(ctx, rec)
		}
		if next == "" {
			return nil
		}
		token = next
	}
}

func (m *Manager) recoverOne(ctx context.Context, rec store.Sandbox) {
	fail := func(reason string) {
		if _, err := m.move(ctx, rec, Failed, reason); err != nil {
			m.log.Error("mark unrecoverable sandbox failed", "id", rec.ID, "err", err)
		}
		m.log.Warn("sandbox not recovered", "id", rec.ID, "reason", reason)
	}
	if State(rec.State) == Creating || len(rec.Handle) == 0 {
		_ = m.be.Destroy(ctx, rec.ID) // a create the daemon died in
		fail("the daemon stopped while the sandbox was being created")
		return
	}
	var h backend.Handle
	if err := json.Unmarshal(rec.Handle, &h); err != nil {
		fail("stored backend handle is unreadable: " + err.Error())
		return
	}
	info, err := m.be.Recover(ctx, h)
	switch {
	case err != nil:
		fail("backend could not recover it: " + err.Error())
	case info.Status == backend.StatusDead:
		fail("its init was gone after the daemon restarted: " + info.Reason)
	default:
		m.log.Info("sandbox recovered", "id", rec.ID, "status", info.Status)
	}
}

// reaper enforces timeouts until ctx ends.
func (m *Manager) reaper(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.reapOnce(ctx)
		}
	}
}

// checkDied records a running sandbox whose init has died as failed.
// Without it a sandbox that died on its own (or between a restart's
// recovery and the backend noticing) would read "running" until some
// command failed in it.
func (m *Manager) checkDied(ctx context.Context, rec store.Sandbox) {
	if State(rec.State) != Running {
		return
	}
	if info, err := m.be.Inspect(ctx, rec.ID); err == nil && info.Status == backend.StatusDead {
		m.Died(ctx, rec.ID, info.Reason)
		m.log.Warn("sandbox failed: its init died", "id", rec.ID, "reason", info.Reason)
	}
}

func (m *Manager) reapOnce(ctx context.Context) {
	token := ""
	now := time.Now()
	for {
		recs, next, err := m.st.ListSandboxes(ctx, store.ListFilter{
			States: []string{string(Running), string(Paused), string(Failed)}, Limit: 1000, PageToken: token})
		if err != nil {
			return
		}
		for _, rec := range recs {
			m.checkDied(ctx, rec)
			sb, err := fromRecord(rec)
			if err != nil || sb.Deadline.IsZero() || now.Before(sb.Deadline) {
				continue
			}
			unlock := m.lock(rec.ID)
			if err := m.destroy(ctx, rec, "timeout"); err != nil {
				m.log.Error("destroy on timeout", "id", rec.ID, "err", err)
			} else {
				m.log.Info("sandbox destroyed: timeout", "id", rec.ID)
			}
			unlock()
		}
		if next == "" {
			return
		}
		token = next
	}
}
