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
			States: []string{string(Creating), string(Running), string(Paused), string(Suspended)}, Limit: 1000, PageToken: token})
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
	case State(rec.State) == Suspended:
		// Its files are in the archive; its init is meant to be gone (the
		// stored handle predates the suspend). One still running is a
		// suspend or resume the daemon died in: stop it, the archive wins.
		if info.Status == backend.StatusRunning || info.Status == backend.StatusPaused {
			if err := m.be.Stop(ctx, rec.ID); err != nil {
				fail("could not stop it after an interrupted suspend: " + err.Error())
				return
			}
		}
		m.log.Info("sandbox recovered", "id", rec.ID, "state", rec.State)
	case info.Status == backend.StatusDead:
		fail("its init was gone after the daemon restarted: " + info.Reason)
	case State(rec.State) == Paused:
		// The backend adopts it without knowing it was frozen; freezing
		// again (idempotent) makes both agree.
		if pz, ok := m.be.(backend.Pauser); ok {
			if err := pz.Pause(ctx, rec.ID); err != nil {
				fail("could not pause it again after the restart: " + err.Error())
				return
			}
		}
		m.recoverNet(ctx, rec)
		m.log.Info("sandbox recovered", "id", rec.ID, "state", rec.State)
	default:
		m.recoverNet(ctx, rec)
		m.log.Info("sandbox recovered", "id", rec.ID, "state", rec.State, "status", info.Status)
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
	for {
		recs, next, err := m.st.ListSandboxes(ctx, store.ListFilter{
			States: []string{string(Running), string(Paused), string(Suspended)}, Limit: 1000, PageToken: token})
		if err != nil {
			return
		}
		for _, rec := range recs {
			m.checkDied(ctx, rec)
			m.checkTimers(ctx, rec, time.Now())
		}
		if next == "" {
			return
		}
		token = next
	}
}

// checkTimers applies a sandbox's timeout, idle timeout and retirement.
func (m *Manager) checkTimers(ctx context.Context, rec store.Sandbox, now time.Time) {
	sb, err := fromRecord(rec)
	if err != nil {
		return
	}
	switch {
	case sb.State != Suspended && sb.Spec.Timeout > 0 && sb.Timers.Used(now) >= sb.Spec.Timeout:
		if sb.Spec.OnTimeout == "suspend" {
			m.timed(ctx, rec.ID, "timeout", Suspended)
		} else {
			m.timed(ctx, rec.ID, "timeout", Destroyed)
		}
	case sb.State == Running && m.idle(ctx, sb, now):
		m.timed(ctx, rec.ID, "idle", Suspended)
	case sb.State == Suspended && retireDue(sb, now):
		m.timed(ctx, rec.ID, "suspended for "+orDefault(sb.Spec.RetireAfter, DefaultRetireAfter).String(), Retired)
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func retireDue(sb Sandbox, now time.Time) bool {
	after := orDefault(sb.Spec.RetireAfter, DefaultRetireAfter)
	return after > 0 && !sb.Timers.SuspendedAt.IsZero() && now.Sub(sb.Timers.SuspendedAt) >= after
}

// idle reports whether a running sandbox has been idle for its idle
// timeout: no process but init, nothing held open, no API call.
func (m *Manager) idle(ctx context.Context, sb Sandbox, now time.Time) bool {
	limit := orDefault(sb.Spec.IdleTimeout, DefaultIdleTimeout)
	if limit < 0 || m.opts.Blobs == nil {
		return false
	}
	if info, err := m.be.Inspect(ctx, sb.ID); err != nil || info.Processes != 0 {
		m.Touch(sb.ID) // busy, or unknown: not idle
		return false
	}
	return now.Sub(m.lastActive(sb.ID, sb.Timers.RunningSince)) >= limit
}

// timed carries out a timer's verdict under the sandbox's lock, if the
// sandbox is still where the verdict found it.
func (m *Manager) timed(ctx context.Context, id, why string, to State) {
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, "", id)
	if err != nil {
		return
	}
	switch to {
	case Destroyed:
		err = m.destroy(ctx, rec, why)
	case Suspended:
		if State(rec.State) == Running || State(rec.State) == Paused {
			_, err = m.suspend(ctx, rec, why)
		}
	case Retired:
		err = m.retire(ctx, rec, why)
	}
	if err != nil {
		m.log.Error("lifecycle timer", "id", id, "to", to, "why", why, "err", err)
		if to == Suspended && why == "idle" {
			m.Touch(id) // do not retry every second
		}
		return
	}
	m.log.Info("lifecycle timer", "id", id, "to", to, "why", why)
}

// retire lets a suspended sandbox's backend state go; its record and
// archive stay, and it can still be resumed.
func (m *Manager) retire(ctx context.Context, rec store.Sandbox, why string) error {
	if State(rec.State) != Suspended {
		return nil
	}
	if err := m.be.Destroy(context.WithoutCancel(ctx), rec.ID); err != nil {
		return err
	}
	_, err := m.move(ctx, rec, Retired, why)
	return err
}

// recoverNet gives an adopted sandbox its network again: the daemon's
// router (and every link into it) went with the old daemon.
func (m *Manager) recoverNet(ctx context.Context, rec store.Sandbox) {
	if err := m.netUp(ctx, rec); err != nil {
		m.log.Error("sandbox recovered without its network", "id", rec.ID, "err", err)
	}
}
