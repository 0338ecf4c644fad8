package native

import (
	"context"

	"github.com/hutch-dev/hutch/internal/backend"
)

var _ backend.Watcher = (*Backend)(nil)

// Watch implements backend.Watcher: the agent watches with inotify from
// inside the sandbox, so the path resolves as the sandbox sees it.
func (b *Backend) Watch(ctx context.Context, id, dir string, recursive bool) (backend.WatchStream, error) {
	c, err := b.files(id)
	if err != nil {
		return nil, err
	}
	return c.Watch(ctx, dir, recursive)
}
