package native

import (
	"context"
	"path/filepath"
	"strconv"
	"time"
)

// startPool keeps opts.WarmInits inits parked, each on its own uid range
// and cgroup, so Create only has to hand one its layers.
func (b *Backend) startPool() {
	if b.opts.WarmInits < 0 {
		b.stop = func() {}
		return
	}
	b.pool = make(chan *parked, b.opts.WarmInits)
	ctx, cancel := context.WithCancel(context.Background())
	b.done = make(chan struct{})
	b.stop = cancel
	go b.refill(ctx)
}

// refill parks inits until the pool is full, then waits for a claim.
func (b *Backend) refill(ctx context.Context) {
	defer close(b.done)
	for n := 0; ; n++ {
		p, err := b.parkOne(n)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		select {
		case b.pool <- p:
		case <-ctx.Done():
			b.discard(p)
			return
		}
	}
}

func (b *Backend) parkOne(n int) (*parked, error) {
	slot, ok := b.slots.take()
	if !ok {
		return nil, errPoolFull
	}
	sock := filepath.Join(b.opts.DataDir, "pool", "init-"+strconv.Itoa(slot)+".sock")
	p, err := b.park(slot, sock)
	if err != nil {
		b.slots.release(slot)
		return nil, err
	}
	return p, nil
}

// claimParked takes a live parked init, or returns nil.
func (b *Backend) claimParked() *parked {
	for b.pool != nil {
		select {
		case p := <-b.pool:
			if p.alive() {
				return p
			}
			b.discard(p)
		default:
			return nil
		}
	}
	return nil
}

func (b *Backend) discard(p *parked) {
	p.kill()
	b.slots.release(p.slot)
}

// stopPool stops the refiller and kills every parked init.
func (b *Backend) stopPool() {
	if b.pool == nil {
		return
	}
	b.stop()
	<-b.done
	for {
		select {
		case p := <-b.pool:
			b.discard(p)
		default:
			return
		}
	}
}

type poolError string

func (e poolError) Error() string { return string(e) }

const errPoolFull = poolError("no uid range free for a warm init")
