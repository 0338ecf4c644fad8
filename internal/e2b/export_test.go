package e2b

import "time"

// SetSweep makes every envd start sweep once more than above sandboxes are
// tracked, for a test; the returned func restores the defaults.
func SetSweep(above int) func() {
	oldAbove, oldEvery := sweepAbove, sweepEvery
	sweepAbove, sweepEvery = above, time.Duration(0)
	return func() { sweepAbove, sweepEvery = oldAbove, oldEvery }
}

// Tracked lists the sandboxes the handler keeps process configs or polling
// watchers for.
func (h *Handler) Tracked() []string {
	return append(h.procs.sandboxes(), h.watch.sandboxes()...)
}
