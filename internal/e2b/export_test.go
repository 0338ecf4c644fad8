package e2b

// SetSweepAbove lowers the sweep threshold for a test; the returned func
// restores it.
func SetSweepAbove(n int) func() {
	old := sweepAbove
	sweepAbove = n
	return func() { sweepAbove = old }
}

// Tracked lists the sandboxes the handler keeps process configs or polling
// watchers for.
func (h *Handler) Tracked() []string {
	return append(h.procs.sandboxes(), h.watch.sandboxes()...)
}
