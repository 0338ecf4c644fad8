package router

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// tableName is hutch's nftables table in the router namespace.
const tableName = "hutch"

// installRules writes the router's whole ruleset in one transaction:
//
//	prerouting (nat):  port 53 (udp, tcp) → :53 (the resolver);
//	                   every other TCP connection → :proxyPort (the proxy)
//	input (policy drop): loopback; established/related; tcp 53 and
//	                   proxyPort; udp 53
//	forward (policy drop), and ip_forward is 0 anyway.
//
// IPv6 and ICMP have no accept rule, so they are dropped.
func installRules(ns netns.NsHandle, proxyPort uint16) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: tableName})
	drop := nftables.ChainPolicyDrop
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})

	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	// NAT: DNS to the resolver, every other TCP connection to the proxy.
	add(pre, join(ipv4L4(unix.IPPROTO_UDP), dport(53), redirect(53))...)
	add(pre, join(ipv4L4(unix.IPPROTO_TCP), dport(53), redirect(53))...)
	add(pre, join(ipv4L4(unix.IPPROTO_TCP), redirect(proxyPort))...)

	// Input: loopback, replies, and the two services.
	add(in, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")}, accept())
	add(in, &expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)}, accept())
	for _, r := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_TCP, 53}, {unix.IPPROTO_UDP, 53}, {unix.IPPROTO_TCP, proxyPort}} {
		add(in, join(ipv4L4(r.proto), dport(r.port), []expr.Any{accept()})...)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// ipv4L4 matches IPv4 packets of an L4 protocol.
func ipv4L4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// dport matches the TCP or UDP destination port (both at offset 2).
func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func redirect(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func accept() *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictAccept} }

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// Probe checks that this host can run sandbox networking at all: a network
// namespace of our own, and nftables (netlink) inside it. Tests skip on
// its error; it says nothing about hutch's own rules, which New installs.
func Probe() error {
	ns, err := NewNS()
	if err != nil {
		return fmt.Errorf("network namespaces: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "probe"})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}
