package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/hutch-dev/hutch/internal/errdefs"
	"github.com/hutch-dev/hutch/internal/netpolicy"
	"github.com/hutch-dev/hutch/internal/store"
)

// Network enforces sandboxes' network policies. The manager tells it
// whenever a sandbox gets a new init (create, resume from suspend, a
// daemon restart) or a new policy, and when its init is gone.
type Network interface {
	// Apply makes pol the policy of sandbox id, whose init is pid on the
	// host: it attaches the sandbox's network when pol needs one (again
	// if the init changed) and takes it away when pol is deny-all. A new
	// policy applies to the next connection at once.
	Apply(ctx context.Context, id string, pid int, pol *netpolicy.Compiled) error
	// Release forgets a sandbox whose init is gone or going.
	Release(id string)
}

// compilePolicy checks a spec's network policy (nil: deny-all) against
// what this daemon can enforce.
func (m *Manager) compilePolicy(p *netpolicy.Policy) (*netpolicy.Compiled, error) {
	if p == nil {
		return netpolicy.DenyAllPolicy(), nil
	}
	c, err := netpolicy.Compile(*p)
	if err != nil {
		return nil, err
	}
	if c.Networked() && m.opts.Network == nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition,
			"network mode %s: this daemon runs without networking (every sandbox is deny-all)", c.Mode())
	}
	return c, nil
}

// netUp applies the policy stored in a record's spec to its running init.
func (m *Manager) netUp(ctx context.Context, rec store.Sandbox) error {
	if m.opts.Network == nil {
		return nil
	}
	var spec struct {
		Network *netpolicy.Policy `json:"network"`
	}
	if err := json.Unmarshal(rec.Spec, &spec); err != nil {
		return err
	}
	pol, err := m.compilePolicy(spec.Network)
	if err != nil {
		return err
	}
	if !pol.Networked() {
		m.opts.Network.Release(rec.ID)
		return nil
	}
	info, err := m.be.Inspect(ctx, rec.ID)
	if err != nil {
		return err
	}
	return m.opts.Network.Apply(ctx, rec.ID, info.Pid, pol)
}

func (m *Manager) netDown(id string) {
	if m.opts.Network != nil {
		m.opts.Network.Release(id)
	}
}

// SetNetwork changes a sandbox's network policy live: a running or paused
// sandbox's next connection is judged by it; a suspended one gets it when
// it resumes.
func (m *Manager) SetNetwork(ctx context.Context, tenant, id string, p netpolicy.Policy) (Sandbox, error) {
	pol, err := m.compilePolicy(&p)
	if err != nil {
		return Sandbox{}, err
	}
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return Sandbox{}, err
	}
	if st := State(rec.State); st == Destroyed || st == Failed || st == Creating {
		return Sandbox{}, &errdefs.TransitionError{ID: id, From: rec.State, To: "network changed"}
	}
	sb, err := fromRecord(rec)
	if err != nil {
		return Sandbox{}, err
	}
	norm := pol.Policy()
	sb.Spec.Network = &norm
	rec.Spec, _ = json.Marshal(sb.Spec)
	out, err := m.st.UpdateSandbox(ctx, rec)
	if err != nil {
		return Sandbox{}, err
	}
	if st := State(out.State); st == Running || st == Paused {
		if err := m.netUp(ctx, out); err != nil {
			return Sandbox{}, err
		}
	}
	m.Touch(id)
	return fromRecord(out)
}

// NetworkPolicy returns a sandbox's policy with credential values
// redacted, as the API shows it.
func (m *Manager) NetworkPolicy(ctx context.Context, tenant, id string) (netpolicy.Policy, error) {
	sb, err := m.Get(ctx, tenant, id)
	if err != nil {
		return netpolicy.Policy{}, err
	}
	pol, err := netpolicy.Compile(derefPolicy(sb.Spec.Network))
	if err != nil {
		return netpolicy.Policy{}, err
	}
	return pol.Redacted(), nil
}

func derefPolicy(p *netpolicy.Policy) netpolicy.Policy {
	if p == nil {
		return netpolicy.Policy{Mode: netpolicy.DenyAll}
	}
	return *p
}

// EventSource is an optional capability of a Network: the recent egress
// decisions of a sandbox.
type EventSource interface {
	Events(id string) []netpolicy.Event
}

// NetworkEvents returns a sandbox's recent egress decisions, oldest first.
func (m *Manager) NetworkEvents(ctx context.Context, tenant, id string) ([]netpolicy.Event, error) {
	if _, err := m.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	es, ok := m.opts.Network.(EventSource)
	if !ok {
		return []netpolicy.Event{}, nil
	}
	return es.Events(id), nil
}

// ExposedPort is a sandbox port reachable through the daemon.
type ExposedPort struct {
	Port   int    `json:"port"`
	Public bool   `json:"public,omitempty"`
	Token  string `json:"token"`
}

// AllPorts, as an exposed port, stands for every port of the sandbox that
// has no setting of its own (E2B sandboxes are made so).
const AllPorts = 0

// NewPortToken returns a fresh token for an exposed port.
func NewPortToken() string {
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	return "hpt_" + hex.EncodeToString(tok)
}

// ExposePort exposes (or re-exposes, with a new token) a sandbox port;
// AllPorts exposes every port without a setting of its own.
func (m *Manager) ExposePort(ctx context.Context, tenant, id string, port int, public bool) (ExposedPort, error) {
	if port < AllPorts || port > 65535 {
		return ExposedPort{}, errdefs.New(errdefs.ErrInvalidArgument, "port %d is out of range 1-65535 (0: every port)", port)
	}
	ep := ExposedPort{Port: port, Public: public, Token: NewPortToken()}
	err := m.editPorts(ctx, tenant, id, func(ports []ExposedPort) []ExposedPort {
		ports = slices.DeleteFunc(ports, func(p ExposedPort) bool { return p.Port == port })
		return append(ports, ep)
	})
	return ep, err
}

// UnexposePort stops exposing a port; one not exposed is no error.
func (m *Manager) UnexposePort(ctx context.Context, tenant, id string, port int) error {
	return m.editPorts(ctx, tenant, id, func(ports []ExposedPort) []ExposedPort {
		return slices.DeleteFunc(ports, func(p ExposedPort) bool { return p.Port == port })
	})
}

// Ports lists a sandbox's exposed ports.
func (m *Manager) Ports(ctx context.Context, tenant, id string) ([]ExposedPort, error) {
	sb, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return slices.Clone(sb.Spec.Ports), nil
}

// Port returns the tenant of a sandbox and the setting of one of its
// exposed ports; not_found when the port is not exposed.
func (m *Manager) Port(ctx context.Context, id string, port int) (string, ExposedPort, error) {
	if port < 1 || port > 65535 {
		return "", ExposedPort{}, errdefs.New(errdefs.ErrNotFound, "port %d of sandbox %s is not exposed", port, id)
	}
	sb, err := m.Get(ctx, "", id)
	if err != nil {
		return "", ExposedPort{}, err
	}
	all := -1
	for i, p := range sb.Spec.Ports {
		switch p.Port {
		case port:
			return sb.Tenant, p, nil
		case AllPorts:
			all = i
		}
	}
	if all >= 0 && port > 0 {
		p := sb.Spec.Ports[all]
		p.Port = port
		return sb.Tenant, p, nil
	}
	return "", ExposedPort{}, errdefs.New(errdefs.ErrNotFound, "port %d of sandbox %s is not exposed", port, id)
}

func (m *Manager) editPorts(ctx context.Context, tenant, id string, edit func([]ExposedPort) []ExposedPort) error {
	unlock := m.lock(id)
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, tenant, id)
	if err != nil {
		return err
	}
	if st := State(rec.State); st == Destroyed || st == Failed {
		return &errdefs.TransitionError{ID: id, From: rec.State, To: "ports changed"}
	}
	sb, err := fromRecord(rec)
	if err != nil {
		return err
	}
	sb.Spec.Ports = edit(sb.Spec.Ports)
	if len(sb.Spec.Ports) > 64 {
		return errdefs.New(errdefs.ErrResourceExhausted, "a sandbox exposes at most 64 ports")
	}
	rec.Spec, _ = json.Marshal(sb.Spec)
	if _, err := m.st.UpdateSandbox(ctx, rec); err != nil {
		return err
	}
	m.Touch(id)
	return nil
}

// buildNetwork gives a template's build sandbox the build's policy.
func (m *Manager) buildNetwork(ctx context.Context, id string, p *netpolicy.Policy) error {
	pol, err := m.compilePolicy(p)
	if err != nil || !pol.Networked() {
		return err
	}
	info, err := m.be.Inspect(ctx, id)
	if err != nil {
		return err
	}
	if err := m.opts.Network.Apply(ctx, id, info.Pid, pol); err != nil {
		return fmt.Errorf("the build sandbox's network: %w", err)
	}
	return nil
}

// Networked reports whether this manager can give sandboxes a network.
func (m *Manager) Networked() bool { return m.opts.Network != nil }
