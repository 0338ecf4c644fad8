package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hutch-dev/hutch/internal/backend"
	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/store"
	"github.com/hutch-dev/hutch/internal/tarfs"
)

// A template is a tenant's named recipe: a base, files to seed, host trees
// to copy in, environment, and setup commands. Preparing it runs the recipe
// once in a build sandbox and freezes the resulting writable layer as an
// immutable layer directory under LayerDir, named at random and recorded
// under its generation: a hash of everything that went into it. Sandboxes
// made from the template stack that layer read-only (no copy), so they
// start as fast as any other. Concurrent requests for one generation share
// one build; a failed build is reported with its log and tried again on
// the next request; a changed recipe has a new generation, and the old one
// stays as long as a sandbox uses it (then it is collected).

// Limits of a template definition.
const (
	maxSetup        = 100
	maxSetupBytes   = 64 << 10
	maxFiles        = 1000
	maxFileBytes    = 32 << 20 // all files together
	maxMounts       = 32
	maxMountEntries = 200_000
	maxLogTail      = 16 << 10 // kept with a failed build's status
	maxErrLog       = 4 << 10  // put in a failed build's error message
	maxEventBytes   = 4 << 20  // build output kept for late watchers
	// DefaultBuildTimeout bounds a template build.
	DefaultBuildTimeout = 30 * time.Minute
	// DefaultMaxPool bounds a template's warm pool.
	DefaultMaxPool = 32
	// MaxFork bounds how many sandboxes one fork makes.
	MaxFork = 16
)

var templateName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// TemplateDef is what a template is made of.
type TemplateDef struct {
	Base string `json:"base,omitempty"`
	// Setup commands run in order with sh -c, after the files and mounts
	// are in place; the first that fails fails the build.
	Setup  []string          `json:"setup,omitempty"`
	Files  []TemplateFile    `json:"files,omitempty"`
	Mounts []TemplateMount   `json:"mounts,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	Cwd    string            `json:"cwd,omitempty"`
	Limits backend.Limits    `json:"limits"`
	// Network is the build's network policy (nil: deny-all): what the
	// setup commands may reach. It holds credential values.
	Network *netpolicy.Policy `json:"network,omitempty"`
	// Snapshot is set on a template made by Snapshot: it has no recipe,
	// only the generation the snapshot made.
	Snapshot *SnapshotSource `json:"snapshot,omitempty"`
}

// TemplateFile is a file seeded into a template's sandboxes. A relative
// path is under /workspace; ~/ is root's home.
type TemplateFile struct {
	Path    string      `json:"path"`
	Content []byte      `json:"content,omitempty"`
	Mode    fs.FileMode `json:"mode,omitempty"` // default 0644
}

// TemplateMount is a host directory tree copied into the template's layer
// at Path (read-only: writes to it stay in the writing sandbox). Only the
// local socket may name host paths; the server checks that.
type TemplateMount struct {
	Path   string `json:"path"`
	Source string `json:"source"`
}

// SnapshotSource says where a snapshot template came from.
type SnapshotSource struct {
	Sandbox string    `json:"sandbox"`
	Taken   time.Time `json:"taken"`
}

// BuildStatus is the outcome of a template's last build.
type BuildStatus struct {
	State      string    `json:"state"` // ready or failed
	Generation string    `json:"generation,omitempty"`
	Error      string    `json:"error,omitempty"`
	Log        string    `json:"log,omitempty"` // the tail of the setup output, when it failed
	At         time.Time `json:"at"`
}

// Template statuses.
const (
	TemplateNone     = "none"     // never built (or changed since)
	TemplateBuilding = "building" // a build is under way
	TemplateReady    = "ready"    // the current generation is built
	TemplateFailed   = "failed"   // the last build failed
)

// Template is the manager's view of a template.
type Template struct {
	Tenant     string
	Name       string
	Def        TemplateDef
	Generation string // the current generation, "" until built
	Status     string
	Build      BuildStatus
	PoolSize   int
	PoolReady  int
	Created    time.Time
	Updated    time.Time
}

// BuildEvent is one step of a build, or output of its setup commands.
type BuildEvent struct {
	Type string // "step" or "output"
	Step int    // 1-based setup command; 0 for seeding files and mounts
	Cmd  string // step: what runs
	Data []byte // output
}

// BuildError is a failed template build, with the tail of its log.
type BuildError struct {
	Template   string
	Generation string
	Step       int    // the setup command that failed (1-based), 0 if none did
	Cmd        string // that command
	Log        string // the tail of the setup output
	Err        error  // what went wrong, with its class
}

func (e *BuildError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "template %q: build failed", e.Template)
	if e.Step > 0 {
		fmt.Fprintf(&b, " at setup step %d (%s)", e.Step, e.Cmd)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if log := tail(e.Log, maxErrLog); log != "" {
		b.WriteString("; log:\n" + log)
	}
	return b.String()
}

func (e *BuildError) Unwrap() error { return e.Err }

// templates is the manager's template, pool and layer machinery.
type templates struct {
	dir string // LayerDir

	mu     sync.Mutex
	builds map[string]*build // by generation
	pins   map[string]int    // layer dirs a create, snapshot or build is using
	ready  map[poolKey][]pooled
	sizes  map[poolKey]int       // pool sizes wanted: the store's, kept here so a refill under way sees a change at once
	failed map[poolKey]time.Time // the last failed refill, to back off

	kick   chan struct{}
	ctx    context.Context // ends at Close: the loop and every build
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startTemplates prepares LayerDir, clears what a crash left there,
// re-adopts pooled sandboxes and starts the pool and layer loop.
func (m *Manager) startTemplates(ctx context.Context) error {
	if m.opts.LayerDir == "" {
		return nil
	}
	if m.opts.PoolInterval == 0 {
		m.opts.PoolInterval = 2 * time.Second
	}
	if m.opts.BuildTimeout == 0 {
		m.opts.BuildTimeout = DefaultBuildTimeout
	}
	if m.opts.MaxPool == 0 {
		m.opts.MaxPool = DefaultMaxPool
	}
	dir, err := filepath.Abs(m.opts.LayerDir)
	if err != nil {
		return err
	}
	// Layer files keep their in-sandbox owners shifted to host ids, so
	// one may be setuid host root: the directory is never listable or
	// writable by others, and each layer is named at random.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	t := &templates{dir: dir, builds: map[string]*build{}, pins: map[string]int{},
		ready: map[poolKey][]pooled{}, sizes: map[poolKey]int{}, failed: map[poolKey]time.Time{}, kick: make(chan struct{}, 1)}
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.tpl = t
	m.cleanLayerDir(ctx)
	if err := m.adoptPools(ctx); err != nil {
		return err
	}
	t.wg.Add(1)
	go m.templateLoop()
	return nil
}

func (m *Manager) stopTemplates() {
	if m.tpl == nil {
		return
	}
	m.tpl.cancel()
	m.tpl.wg.Wait()
}

// kickTemplates asks the loop to refill pools and collect layers soon.
func (m *Manager) kickTemplates() {
	if m.tpl == nil {
		return
	}
	select {
	case m.tpl.kick <- struct{}{}:
	default:
	}
}

// templateLoop refills pools and collects unused layers until Close.
func (m *Manager) templateLoop() {
	t := m.tpl
	defer t.wg.Done()
	tick := time.NewTicker(m.opts.PoolInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		case <-t.kick:
		}
		m.reconcilePools(t.ctx)
		if _, err := m.CollectLayers(t.ctx); err != nil && t.ctx.Err() == nil {
			m.log.Warn("collect unused layers", "err", err)
		}
	}
}

// cleanLayerDir removes what a daemon that died left in LayerDir: build
// sandboxes, half-written layers, directories no layer record names, and
// records whose directory is gone.
func (m *Manager) cleanLayerDir(ctx context.Context) {
	dir := m.tpl.dir
	entries, _ := os.ReadDir(dir)
	layers, err := m.st.ListLayers(ctx)
	if err != nil {
		m.log.Warn("layers: list", "err", err)
		return
	}
	// What a sandbox record stacks is never removed here, whatever the
	// layer records say (a database restored from a backup, say): running
	// sandboxes have those directories as their lower layers.
	known := map[string]bool{}
	inUse, err := m.st.SpecStrings(ctx, "$.layers", string(Destroyed))
	if err != nil {
		m.log.Warn("layers: list those in use", "err", err)
		return
	}
	for _, p := range inUse {
		if filepath.Dir(p) == dir {
			known[filepath.Base(p)] = true
		}
	}
	for _, l := range layers {
		if _, err := os.Stat(filepath.Join(dir, l.Dir)); err != nil {
			m.log.Warn("layer directory missing; forgetting its generation", "generation", l.ID, "dir", l.Dir)
			_ = m.st.DeleteLayer(ctx, l.ID)
			continue
		}
		known[l.Dir] = true
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, ".build-"):
			_ = m.be.Destroy(ctx, strings.TrimPrefix(name, ".build-"))
			_ = os.Remove(filepath.Join(dir, name))
		case !known[name]:
			_ = os.RemoveAll(filepath.Join(dir, name))
		}
	}
}

func (m *Manager) needTemplates() error {
	if m.tpl == nil {
		return errdefs.New(errdefs.ErrNotImplemented, "templates need a layer directory (the daemon's data dir)")
	}
	if _, ok := m.be.(backend.Snapshotter); !ok {
		return errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot snapshot, so it has no templates", m.be.Name())
	}
	return nil
}

func checkTemplateName(name string) error {
	if !templateName.MatchString(name) {
		return errdefs.New(errdefs.ErrInvalidArgument, "template name %q: want [a-z0-9][a-z0-9._-]{0,62}", name)
	}
	return nil
}

// templateLock serializes changes to one template. Its key cannot be a
// sandbox id (those have no colon).
func (m *Manager) templateLock(tenant, name string) func() {
	return m.lock("tmpl:" + tenant + "\x00" + name)
}

// PutTemplate creates or replaces tenant's template name. A changed recipe
// drops the current generation (the next create builds the new one);
// sandboxes made from the old one keep it. The pool size stays.
func (m *Manager) PutTemplate(ctx context.Context, tenant, name string, def TemplateDef) (Template, error) {
	if err := m.needTemplates(); err != nil {
		return Template{}, err
	}
	if err := checkTemplateName(name); err != nil {
		return Template{}, err
	}
	def.Snapshot = nil
	if err := normalizeDef(&def); err != nil {
		return Template{}, err
	}
	if _, err := m.compilePolicy(def.Network); err != nil {
		return Template{}, fmt.Errorf("build network: %w", err)
	}
	raw, err := json.Marshal(def)
	if err != nil {
		return Template{}, err
	}
	unlock := m.templateLock(tenant, name)
	defer unlock()
	rec := store.Template{Tenant: tenant, Name: name, Spec: raw}
	if old, err := m.st.GetTemplate(ctx, tenant, name); err == nil {
		rec.PoolSize = old.PoolSize
		if bytes.Equal(old.Spec, raw) {
			rec.Generation, rec.Build = old.Generation, old.Build
		}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return Template{}, err
	}
	out, err := m.st.PutTemplate(ctx, rec)
	if err != nil {
		return Template{}, err
	}
	m.kickTemplates()
	return m.view(out)
}

// GetTemplate returns tenant's template name.
func (m *Manager) GetTemplate(ctx context.Context, tenant, name string) (Template, error) {
	if err := m.needTemplates(); err != nil {
		return Template{}, err
	}
	rec, err := m.st.GetTemplate(ctx, tenant, name)
	if err != nil {
		return Template{}, err
	}
	return m.view(rec)
}

// ListTemplates lists tenant's templates, or every tenant's with all.
func (m *Manager) ListTemplates(ctx context.Context, tenant string, all bool) ([]Template, error) {
	if err := m.needTemplates(); err != nil {
		return nil, err
	}
	recs, err := m.st.ListTemplates(ctx, tenant, all)
	if err != nil {
		return nil, err
	}
	out := make([]Template, 0, len(recs))
	for _, r := range recs {
		t, err := m.view(r)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// DeleteTemplate removes tenant's template name and empties its pool.
// Sandboxes made from it keep their layers; unused ones are collected.
func (m *Manager) DeleteTemplate(ctx context.Context, tenant, name string) error {
	if err := m.needTemplates(); err != nil {
		return err
	}
	unlock := m.templateLock(tenant, name)
	defer unlock()
	if err := m.st.DeleteTemplate(ctx, tenant, name); err != nil {
		return err
	}
	m.setPoolSize(poolKey{tenant, name}, 0)
	m.trimPool(ctx, poolKey{tenant, name}, 0, "")
	m.kickTemplates()
	return nil
}

func decodeDef(rec store.Template) (TemplateDef, error) {
	var def TemplateDef
	if err := json.Unmarshal(rec.Spec, &def); err != nil {
		return def, fmt.Errorf("template %q: stored definition: %w", rec.Name, err)
	}
	return def, nil
}

func (m *Manager) view(rec store.Template) (Template, error) {
	def, err := decodeDef(rec)
	if err != nil {
		return Template{}, err
	}
	t := Template{Tenant: rec.Tenant, Name: rec.Name, Def: def, Generation: rec.Generation, PoolSize: rec.PoolSize,
		Created: rec.Created, Updated: rec.Updated, Status: TemplateNone}
	if len(rec.Build) > 0 {
		_ = json.Unmarshal(rec.Build, &t.Build)
	}
	switch {
	case m.building(rec.Tenant, rec.Name):
		t.Status = TemplateBuilding
	case t.Build.State == TemplateFailed && t.Build.Generation != t.Generation:
		t.Status = TemplateFailed // the last try failed (an older generation may still serve)
	case t.Generation != "":
		t.Status = TemplateReady
	}
	m.tpl.mu.Lock()
	t.PoolReady = len(m.tpl.ready[poolKey{rec.Tenant, rec.Name}])
	m.tpl.mu.Unlock()
	return t, nil
}

func (m *Manager) building(tenant, name string) bool {
	m.tpl.mu.Lock()
	defer m.tpl.mu.Unlock()
	for _, b := range m.tpl.builds {
		if b.tenant == tenant && slices.Contains(b.names, name) {
			return true
		}
	}
	return false
}

// normalizeDef checks a definition and puts its paths in canonical form.
func normalizeDef(d *TemplateDef) error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrInvalidArgument, format, args...)
	}
	if d.Cwd != "" && (!path.IsAbs(d.Cwd) || strings.IndexByte(d.Cwd, 0) >= 0) {
		return bad("cwd %q: want an absolute path", d.Cwd)
	}
	if len(d.Setup) > maxSetup {
		return bad("%d setup commands: at most %d", len(d.Setup), maxSetup)
	}
	for i, c := range d.Setup {
		if strings.TrimSpace(c) == "" || len(c) > maxSetupBytes || strings.IndexByte(c, 0) >= 0 {
			return bad("setup command %d: want a non-empty command of at most %d bytes without NUL", i+1, maxSetupBytes)
		}
	}
	if len(d.Files) > maxFiles {
		return bad("%d files: at most %d", len(d.Files), maxFiles)
	}
	total := 0
	for i := range d.Files {
		f := &d.Files[i]
		p, err := seedPath(f.Path)
		if err != nil {
			return bad("file %q: %v", f.Path, err)
		}
		f.Path = p
		if f.Mode == 0 {
			f.Mode = 0o644
		}
		if f.Mode&^(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			return bad("file %q: mode %v: want permission bits only", f.Path, f.Mode)
		}
		total += len(f.Content)
	}
	if total > maxFileBytes {
		return bad("files hold %d bytes: at most %d", total, maxFileBytes)
	}
	if len(d.Mounts) > maxMounts {
		return bad("%d mounts: at most %d", len(d.Mounts), maxMounts)
	}
	for i := range d.Mounts {
		mt := &d.Mounts[i]
		p, err := seedPath(mt.Path)
		if err != nil {
			return bad("mount %q: %v", mt.Path, err)
		}
		mt.Path = p
		if !filepath.IsAbs(mt.Source) || strings.IndexByte(mt.Source, 0) >= 0 {
			return bad("mount source %q: want an absolute host path", mt.Source)
		}
		mt.Source = filepath.Clean(mt.Source)
		if fi, err := os.Stat(mt.Source); err != nil || !fi.IsDir() {
			return bad("mount source %s: not a directory on the host", mt.Source)
		}
	}
	return nil
}

// seedPath makes a file or mount path absolute: relative is under
// /workspace, ~ and $HOME are root's home. Paths the sandbox mounts over
// (or keeps in memory) are refused: what is put there would not be kept.
func seedPath(p string) (string, error) {
	switch {
	case p == "" || strings.IndexByte(p, 0) >= 0:
		return "", errors.New("want a path without NUL bytes")
	case p == "~" || p == "$HOME":
		p = "/root"
	case strings.HasPrefix(p, "~/"):
		p = "/root/" + p[2:]
	case strings.HasPrefix(p, "$HOME/"):
		p = "/root/" + p[6:]
	case !path.IsAbs(p):
		p = "/workspace/" + p
	}
	p = path.Clean(p)
	if p == "/" {
		return "", errors.New("cannot be the root")
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "", fmt.Errorf("%s is not part of the kept filesystem", d)
		}
	}
	return p, nil
}

// generation is the content key of tenant's recipe: a hash of everything
// that goes into the build. Host trees count by a listing of their paths,
// modes, sizes and modification times. The tenant is part of it, so
// tenants never share a layer (nor learn of each other's by timing).
func generation(tenant string, d TemplateDef) (string, error) {
	h := sha256.New()
	put := func(parts ...string) {
		for _, p := range parts {
			fmt.Fprintf(h, "%d:%s;", len(p), p)
		}
	}
	put("hutch-template-v1", tenant, d.Base, d.Cwd, strconv.Itoa(len(d.Setup)))
	put(d.Setup...)
	for _, k := range slices.Sorted(maps.Keys(d.Env)) {
		put("env", k, d.Env[k])
	}
	for _, f := range d.Files {
		sum := sha256.Sum256(f.Content)
		put("file", f.Path, strconv.FormatUint(uint64(f.Mode), 8), hex.EncodeToString(sum[:]))
	}
	for _, mt := range d.Mounts {
		sum, err := treeListing(mt.Source)
		if err != nil {
			return "", err
		}
		put("mount", mt.Path, mt.Source, sum)
	}
	return "g-" + hex.EncodeToString(h.Sum(nil))[:32], nil
}

// treeListing hashes a host tree's listing (not its contents).
func treeListing(root string) (string, error) {
	h := sha256.New()
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > maxMountEntries {
			return fmt.Errorf("more than %d entries", maxMountEntries)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		fmt.Fprintf(h, "%q %o %d %d %q\n", rel, fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), link)
		return nil
	})
	if err != nil {
		return "", errdefs.New(errdefs.ErrInvalidArgument, "mount source %s: %v", root, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// pinGen looks up a generation and pins its layer directories, so they
// are not collected until unpin; a missing generation is ErrNotFound.
func (m *Manager) pinGen(ctx context.Context, gen string) (store.Layer, func(), error) {
	t := m.tpl
	t.mu.Lock()
	defer t.mu.Unlock()
	l, err := m.st.GetLayer(ctx, gen)
	if err != nil {
		return l, nil, err
	}
	return l, m.pinLocked(l.Chain), nil
}

// pinLocked pins dirs; t.mu is held. The returned func unpins, once.
func (m *Manager) pinLocked(dirs []string) func() {
	t := m.tpl
	for _, d := range dirs {
		t.pins[d]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			for _, d := range dirs {
				if t.pins[d]--; t.pins[d] <= 0 {
					delete(t.pins, d)
				}
			}
		})
	}
}

// layerPaths turns a chain of layer directory names into the paths the
// backend stacks.
func (m *Manager) layerPaths(chain []string) []string {
	out := make([]string, len(chain))
	for i, d := range chain {
		out[i] = filepath.Join(m.tpl.dir, d)
	}
	return out
}

// ensureBuilt returns tenant's template name with its current generation
// built and pinned, building it first if needed (or joining the build
// under way); watch, when not nil, sees that build's events. built says
// whether a build was waited for.
func (m *Manager) ensureBuilt(ctx context.Context, tenant, name string, watch func(BuildEvent)) (store.Template, store.Layer, func(), bool, error) {
	if err := m.needTemplates(); err != nil {
		return store.Template{}, store.Layer{}, nil, false, err
	}
	rec, err := m.st.GetTemplate(ctx, tenant, name)
	if err != nil {
		return rec, store.Layer{}, nil, false, err
	}
	def, err := decodeDef(rec)
	if err != nil {
		return rec, store.Layer{}, nil, false, err
	}
	if def.Snapshot != nil {
		l, unpin, err := m.pinGen(ctx, rec.Generation)
		if err != nil {
			err = errdefs.New(errdefs.ErrFailedPrecondition, "template %q: its snapshot (generation %s) is gone", name, rec.Generation)
		}
		return rec, l, unpin, false, err
	}
	gen, err := generation(tenant, def)
	if err != nil {
		return rec, store.Layer{}, nil, false, err
	}
	built := false
	for range 3 {
		if l, unpin, err := m.pinGen(ctx, gen); err == nil {
			if rec.Generation != gen {
				m.setGeneration(ctx, rec, gen, BuildStatus{State: TemplateReady, Generation: gen, At: time.Now().UTC()})
			}
			rec.Generation = gen
			return rec, l, unpin, built, nil
		}
		b := m.startBuild(tenant, name, def, gen)
		built = true
		if err := b.follow(ctx, watch); err != nil {
			return rec, store.Layer{}, nil, built, errdefs.New(errdefs.ErrDeadlineExceeded,
				"template %q: the request ended while the template was being built (%v); the build goes on", name, err)
		}
		if b.err != nil {
			return rec, store.Layer{}, nil, built, b.err
		}
	}
	return rec, store.Layer{}, nil, built, errdefs.New(errdefs.ErrUnavailable, "template %q: its layer was collected as soon as it was built; the template is changing", name)
}

// setGeneration records gen as the current generation of the template rec
// was read as, if its recipe is still the same.
func (m *Manager) setGeneration(ctx context.Context, rec store.Template, gen string, st BuildStatus) {
	unlock := m.templateLock(rec.Tenant, rec.Name)
	defer unlock()
	cur, err := m.st.GetTemplate(ctx, rec.Tenant, rec.Name)
	if err != nil || !bytes.Equal(cur.Spec, rec.Spec) {
		return // deleted or changed meanwhile
	}
	if st.State == TemplateReady {
		cur.Generation = gen
	}
	cur.Build, _ = json.Marshal(st)
	if _, err := m.st.PutTemplate(context.WithoutCancel(ctx), cur); err != nil {
		m.log.Warn("record template build", "template", rec.Name, "err", err)
	}
}

// build is one generation's build, shared by everyone waiting for it.
type build struct {
	tenant string
	names  []string // templates waiting for it (guarded by templates.mu)

	mu      sync.Mutex
	events  []BuildEvent
	kept    int // output bytes in events
	changed chan struct{}

	done chan struct{}
	err  error // set before done closes
}

func (b *build) emit(ev BuildEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ev.Type == "output" {
		if b.kept+len(ev.Data) > maxEventBytes {
			return // late watchers miss it; the log tail has it
		}
		b.kept += len(ev.Data)
	}
	b.events = append(b.events, ev)
	close(b.changed)
	b.changed = make(chan struct{})
}

// follow hands watch every event from the start until the build ends
// (nil) or ctx does (its error; the build goes on).
func (b *build) follow(ctx context.Context, watch func(BuildEvent)) error {
	next := 0
	for {
		b.mu.Lock()
		evs, changed := b.events[next:], b.changed
		b.mu.Unlock()
		next += len(evs)
		if watch != nil {
			for _, ev := range evs {
				watch(ev)
			}
		}
		select {
		case <-changed:
		case <-b.done:
			b.mu.Lock()
			evs = b.events[next:]
			b.mu.Unlock()
			if watch != nil {
				for _, ev := range evs {
					watch(ev)
				}
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// startBuild returns the build of gen under way, or starts it.
func (m *Manager) startBuild(tenant, name string, def TemplateDef, gen string) *build {
	t := m.tpl
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.builds[gen]; b != nil {
		if !slices.Contains(b.names, name) {
			b.names = append(b.names, name)
		}
		return b
	}
	b := &build{tenant: tenant, names: []string{name}, changed: make(chan struct{}), done: make(chan struct{})}
	t.builds[gen] = b
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		m.runBuild(b, tenant, name, def, gen)
	}()
	return b
}

// runBuild builds gen, records the outcome on the template and ends b.
func (m *Manager) runBuild(b *build, tenant, name string, def TemplateDef, gen string) {
	ctx, cancel := context.WithTimeout(m.tpl.ctx, m.opts.BuildTimeout)
	defer cancel()
	start := time.Now()
	log := &tailBuffer{max: maxLogTail}
	dir, stats, berr := m.buildLayer(ctx, b, def, log)
	st := BuildStatus{State: TemplateReady, Generation: gen, At: time.Now().UTC()}
	var unpin func()
	if berr == nil {
		m.tpl.mu.Lock()
		unpin = m.pinLocked([]string{dir})
		m.tpl.mu.Unlock()
		defer unpin()
		berr = m.st.PutLayer(context.WithoutCancel(ctx), store.Layer{ID: gen, Tenant: tenant, Dir: dir, Template: name,
			Kind: "build", Base: def.Base, Chain: []string{dir}, Bytes: stats.Bytes, Files: stats.Files})
		if berr != nil {
			_ = os.RemoveAll(filepath.Join(m.tpl.dir, dir))
		}
	}
	if berr != nil {
		var be *BuildError
		if !errors.As(berr, &be) {
			berr = &BuildError{Err: berr}
			be = berr.(*BuildError)
		}
		be.Template, be.Generation, be.Log = name, gen, log.String()
		st = BuildStatus{State: TemplateFailed, Generation: gen, Error: berr.Error(), Log: be.Log, At: time.Now().UTC()}
		m.log.Warn("template build failed", "tenant", tenant, "template", name, "generation", gen, "err", be.Err)
	} else {
		m.log.Info("template built", "tenant", tenant, "template", name, "generation", gen,
			"bytes", stats.Bytes, "took", time.Since(start).Round(time.Millisecond))
	}
	m.tpl.mu.Lock()
	names := slices.Clone(b.names)
	m.tpl.mu.Unlock()
	for _, n := range names {
		rec, err := m.st.GetTemplate(context.WithoutCancel(ctx), tenant, n)
		if err != nil {
			continue
		}
		if d, err := decodeDef(rec); err == nil && d.Snapshot == nil {
			if g, err := generation(tenant, d); err == nil && g == gen {
				m.setGeneration(context.WithoutCancel(ctx), rec, gen, st)
			}
		}
	}
	m.tpl.mu.Lock()
	delete(m.tpl.builds, gen)
	b.err = berr
	close(b.done)
	m.tpl.mu.Unlock()
}

// buildLayer runs a recipe in a build sandbox and freezes its writable
// layer into a new layer directory, whose name it returns.
func (m *Manager) buildLayer(ctx context.Context, b *build, def TemplateDef, log *tailBuffer) (string, layerStats, error) {
	id := "bld-" + randHex(6)
	marker := filepath.Join(m.tpl.dir, ".build-"+id)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return "", layerStats{}, err
	}
	defer func() {
		if err := m.be.Destroy(context.WithoutCancel(ctx), id); err != nil {
			m.log.Warn("destroy build sandbox", "id", id, "err", err)
			return // the marker makes the next start try again
		}
		_ = os.Remove(marker)
	}()
	if _, err := m.be.Create(ctx, backend.Spec{ID: id, Base: def.Base, Env: def.Env, Cwd: def.Cwd, Limits: def.Limits}); err != nil {
		return "", layerStats{}, fmt.Errorf("start the build sandbox: %w", err)
	}
	if err := m.buildNetwork(ctx, id, def.Network); err != nil {
		return "", layerStats{}, err
	}
	defer m.netDown(id)
	if err := m.seed(ctx, id, b, def); err != nil {
		return "", layerStats{}, err
	}
	for i, cmd := range def.Setup {
		if err := m.setupStep(ctx, id, b, i+1, cmd, log); err != nil {
			return "", layerStats{}, err
		}
	}
	return m.freeze(ctx, id)
}

type layerStats struct {
	Bytes int64
	Files int
}

// seed writes a recipe's files and copies its host trees into the build
// sandbox, from the inside (so no path can lead out of it).
func (m *Manager) seed(ctx context.Context, id string, b *build, def TemplateDef) error {
	if len(def.Files) == 0 && len(def.Mounts) == 0 {
		return nil
	}
	b.emit(BuildEvent{Type: "step", Cmd: fmt.Sprintf("seed %d file(s) and %d tree(s)", len(def.Files), len(def.Mounts))})
	fa, ok := m.be.(backend.FileAccessor)
	ar, ok2 := m.be.(backend.Archiver)
	if !ok || !ok2 {
		return errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot write files into a sandbox", m.be.Name())
	}
	for _, f := range def.Files {
		if err := fa.WriteFile(ctx, id, f.Path, f.Mode, bytes.NewReader(f.Content)); err != nil {
			return fmt.Errorf("seed %s: %w", f.Path, err)
		}
	}
	for _, mt := range def.Mounts {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarfs.Write(pw, mt.Source, tarfs.Options{})) }()
		err := ar.WriteArchive(ctx, id, mt.Path, pr)
		pr.CloseWithError(errors.New("copy ended"))
		if err != nil {
			return fmt.Errorf("copy %s to %s: %w", mt.Source, mt.Path, err)
		}
	}
	return nil
}

// setupStep runs one setup command, streaming its output to the build's
// watchers and log; a non-zero exit fails the build.
func (m *Manager) setupStep(ctx context.Context, id string, b *build, step int, cmd string, log *tailBuffer) error {
	b.emit(BuildEvent{Type: "step", Step: step, Cmd: cmd})
	fmt.Fprintf(log, "$ %s\n", cmd)
	timeout := m.opts.BuildTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	p, err := m.be.Exec(ctx, id, backend.ExecRequest{Cmd: cmd, Timeout: timeout})
	if err != nil {
		return &BuildError{Step: step, Cmd: cmd, Err: err}
	}
	defer p.Close()
	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	for {
		ev, err := p.Recv()
		if err != nil {
			if ctx.Err() != nil {
				err = errdefs.New(errdefs.ErrDeadlineExceeded, "the build ran out of time or the daemon stopped")
			}
			return &BuildError{Step: step, Cmd: cmd, Err: err}
		}
		if ev.Exit == nil {
			log.Write(ev.Data)
			b.emit(BuildEvent{Type: "output", Step: step, Data: ev.Data})
			continue
		}
		x := ev.Exit
		switch {
		case x.TimedOut:
			return &BuildError{Step: step, Cmd: cmd, Err: errdefs.New(errdefs.ErrDeadlineExceeded, "timed out")}
		case x.Code != 0:
			why := "exited with status " + strconv.Itoa(x.Code)
			if x.Code < 0 {
				why = "killed by " + x.Signal
			}
			return &BuildError{Step: step, Cmd: cmd, Err: errdefs.New(errdefs.ErrFailedPrecondition, "%s", why)}
		}
		return nil
	}
}

// freeze snapshots a sandbox's writable layer into a new layer directory:
// written aside, its root made private to host root, then renamed into
// place under a random name. Sandboxes only reach it through idmapped
// mounts; no host user can walk into it.
func (m *Manager) freeze(ctx context.Context, id string) (string, layerStats, error) {
	sn, ok := m.be.(backend.Snapshotter)
	if !ok {
		return "", layerStats{}, errdefs.New(errdefs.ErrNotImplemented, "backend %s cannot snapshot", m.be.Name())
	}
	tmp := filepath.Join(m.tpl.dir, ".tmp-"+randHex(8))
	st, err := sn.Snapshot(ctx, id, tmp)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", layerStats{}, err
	}
	name := randHex(16)
	if err := os.Chmod(tmp, 0o700); err != nil {
		_ = os.RemoveAll(tmp)
		return "", layerStats{}, err
	}
	if err := os.Rename(tmp, filepath.Join(m.tpl.dir, name)); err != nil {
		_ = os.RemoveAll(tmp)
		return "", layerStats{}, err
	}
	return name, layerStats{Bytes: st.Bytes, Files: st.Files}, nil
}

// BuildTemplate makes sure tenant's template name has its current
// generation built, building it (or joining the build under way) if
// needed; watch, when not nil, sees that build's steps and output from its
// beginning. cached reports that no build was needed.
func (m *Manager) BuildTemplate(ctx context.Context, tenant, name string, watch func(BuildEvent)) (Template, bool, error) {
	rec, _, unpin, built, err := m.ensureBuilt(ctx, tenant, name, watch)
	if err != nil {
		return Template{}, false, err
	}
	unpin()
	fresh, err := m.st.GetTemplate(ctx, tenant, name)
	if err != nil {
		fresh = rec
	}
	t, err := m.view(fresh)
	if err == nil && t.Generation == "" {
		t.Generation = rec.Generation // changed meanwhile; this is what was built
	}
	return t, !built, err
}

// createFromTemplate makes a sandbox from tenant's template: its current
// generation stacked on its base (built first if needed), or a sandbox
// from its warm pool when the request asks for nothing the pool's
// sandboxes lack.
func (m *Manager) createFromTemplate(ctx context.Context, tenant string, spec Spec) (Sandbox, error) {
	rec, l, unpin, _, err := m.ensureBuilt(ctx, tenant, spec.Template, nil)
	if err != nil {
		return Sandbox{}, err
	}
	defer unpin()
	def, err := decodeDef(rec)
	if err != nil {
		return Sandbox{}, err
	}
	if spec.Base != "" && spec.Base != orText(def.Base, "host") {
		return Sandbox{}, errdefs.New(errdefs.ErrInvalidArgument, "base %q: template %q is built on %q; leave base out", spec.Base, spec.Template, orText(def.Base, "host"))
	}
	if poolable(spec, def) {
		if sb, ok := m.claim(ctx, tenant, poolKey{tenant, spec.Template}, l.ID, spec); ok {
			return sb, nil
		}
	}
	spec.Base, spec.Layers, spec.Generation = def.Base, m.layerPaths(l.Chain), l.ID
	spec.Env = mergeEnv(def.Env, spec.Env)
	spec.Cwd = orText(spec.Cwd, def.Cwd)
	spec.Limits = mergeLimits(def.Limits, spec.Limits)
	return m.create(ctx, tenant, spec, nil)
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func mergeEnv(base, over map[string]string) map[string]string {
	if len(base) == 0 && len(over) == 0 {
		return nil
	}
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}

func mergeLimits(base, over backend.Limits) backend.Limits {
	if over.MemoryBytes != 0 {
		base.MemoryBytes = over.MemoryBytes
	}
	if over.CPUMillis != 0 {
		base.CPUMillis = over.CPUMillis
	}
	if over.Pids != 0 {
		base.Pids = over.Pids
	}
	return base
}

// CollectLayers removes every layer no sandbox (in any state but
// destroyed) stacks, no template has as its current generation, and no
// create, snapshot or build in flight holds. It returns the generations
// removed.
func (m *Manager) CollectLayers(ctx context.Context) ([]string, error) {
	if m.tpl == nil {
		return nil, nil
	}
	t := m.tpl
	// The decision is taken under t.mu, which pinning takes too: a create
	// either pinned its layer before, or its record already names it.
	t.mu.Lock()
	victims, err := m.unusedLayers(ctx)
	var gone []string
	for _, l := range victims {
		if err = m.st.DeleteLayer(ctx, l.ID); err != nil {
			break
		}
		gone = append(gone, l.ID)
	}
	t.mu.Unlock()
	for _, l := range victims[:len(gone)] {
		if rerr := os.RemoveAll(filepath.Join(t.dir, l.Dir)); rerr != nil {
			m.log.Warn("remove unused layer", "generation", l.ID, "err", rerr)
		}
	}
	if len(gone) > 0 {
		m.log.Info("collected unused layers", "generations", gone)
	}
	return gone, err
}

// unusedLayers lists the collectable layers; t.mu is held.
func (m *Manager) unusedLayers(ctx context.Context) ([]store.Layer, error) {
	layers, err := m.st.ListLayers(ctx)
	if err != nil || len(layers) == 0 {
		return nil, err
	}
	used := map[string]bool{}
	paths, err := m.st.SpecStrings(ctx, "$.layers", string(Destroyed))
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		used[filepath.Base(p)] = true
	}
	byID := map[string]store.Layer{}
	for _, l := range layers {
		byID[l.ID] = l
	}
	tmpls, err := m.st.ListTemplates(ctx, "", true)
	if err != nil {
		return nil, err
	}
	for _, tp := range tmpls {
		for _, d := range byID[tp.Generation].Chain {
			used[d] = true
		}
	}
	var out []store.Layer
	for _, l := range layers {
		if !used[l.Dir] && m.tpl.pins[l.Dir] == 0 && m.tpl.builds[l.ID] == nil {
			out = append(out, l)
		}
	}
	return out, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	s := strings.ToValidUTF8(string(t.buf), "\uFFFD")
	if t.cut {
		return "…" + s
	}
	return s
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + strings.ToValidUTF8(s[len(s)-n:], "")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
