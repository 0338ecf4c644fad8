package backend

import (
	"fmt"
	"sort"
	"sync"
)

// Factory makes a backend from its options (a backend-specific struct).
type Factory func(opts any) (Backend, error)

var (
	regMu    sync.Mutex
	registry = map[string]Factory{}
)

// Register makes a backend available by name. Registering a name twice
// panics: it is a programming error.
func Register(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic(fmt.Sprintf("backend %q registered twice", name))
	}
	registry[name] = f
}

// Lookup returns the factory of a registered backend.
func Lookup(name string) (Factory, bool) {
	regMu.Lock()
	defer regMu.Unlock()
	f, ok := registry[name]
	return f, ok
}

// Names lists the registered backends.
func Names() []string {
	regMu.Lock()
	defer regMu.Unlock()
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
