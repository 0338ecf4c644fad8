package native

// WarmReady reports how many parked inits wait in the pool (tests only).
func (b *Backend) WarmReady() int { return len(b.pool) }

// WarmSize is the pool's capacity (tests only).
func (b *Backend) WarmSize() int { return cap(b.pool) }
