package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
)

// A TCP connection between two processes of this host (and network
// namespace) has both of its sockets in the kernel's table
// (/proc/net/tcp, tcp6), each with the user that owns it. The transport
// reads that table to hold loopback TCP to the same rule as its unix
// sockets: a dialer on this host is another process of this user (or one
// Config.AllowUIDs names), whatever address it comes from. A connection
// whose other end is not in the table comes from another host (or another
// network namespace) and must authenticate as a node of the super node.

// errNotLocal says a TCP peer's socket is not on this host.
var errNotLocal = errors.New("transport: the peer's socket is not on this host")

// localTCPOwner returns the user owning the socket at the other end of c
// when that socket is on this host, and errNotLocal when it is not.
func localTCPOwner(c net.Conn) (int, error) {
	local, lok := c.LocalAddr().(*net.TCPAddr)
	remote, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return 0, fmt.Errorf("transport: not a TCP connection: %T", c)
	}
	// The peer's socket has the peer's address as its local one.
	return tcpOwner(remote.AddrPort(), local.AddrPort())
}

// tcpOwner finds the socket bound to local and connected to remote in the
// kernel's tables, and returns its owner's uid.
func tcpOwner(local, remote netip.AddrPort) (int, error) {
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	tables := []string{"/proc/net/tcp", "/proc/net/tcp6"}
	if local.Addr().Is6() {
		tables = tables[1:]
	}
	for _, table := range tables {
		b, err := os.ReadFile(table)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6 on this host
			}
			return 0, fmt.Errorf("transport: reading the kernel's socket table: %w", err)
		}
		if uid, ok := findTCPOwner(b, local, remote); ok {
			return uid, nil
		}
	}
	return 0, errNotLocal
}

// findTCPOwner looks for local→remote in the text of a /proc/net/tcp table.
func findTCPOwner(table []byte, local, remote netip.AddrPort) (int, bool) {
	s := bufio.NewScanner(bytes.NewReader(table))
	s.Buffer(make([]byte, 0, 512), 4096)
	s.Scan() // the header
	for s.Scan() {
		f := bytes.Fields(s.Bytes())
		if len(f) < 8 {
			continue
		}
		l, err1 := parseProcAddr(f[1])
		r, err2 := parseProcAddr(f[2])
		if err1 != nil || err2 != nil || l != local || r != remote {
			continue
		}
		uid, err := strconv.Atoi(string(f[7]))
		if err != nil {
			return 0, false
		}
		return uid, true
	}
	return 0, false
}

// parseProcAddr parses "0100007F:1F90": an address as the kernel's 32-bit
// words in host (little-endian) order, and a port in hex. IPv4-mapped IPv6
// addresses come back as IPv4.
func parseProcAddr(b []byte) (netip.AddrPort, error) {
	host, port, ok := bytes.Cut(b, []byte(":"))
	if !ok || (len(host) != 8 && len(host) != 32) || len(port) != 4 {
		return netip.AddrPort{}, fmt.Errorf("transport: malformed socket address %q", b)
	}
	raw := make([]byte, len(host)/2)
	if _, err := hex.Decode(raw, host); err != nil {
		return netip.AddrPort{}, fmt.Errorf("transport: malformed socket address %q", b)
	}
	p, err := strconv.ParseUint(string(port), 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("transport: malformed socket address %q", b)
	}
	// Each 32-bit word of the address is printed as a number in host
	// order: put it back in memory order.
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(p)), nil
}

// allowedUID says whether a process of uid may talk to this endpoint on
// this host.
func allowedUID(uid int, allow []int) error {
	if uid != os.Geteuid() && !slices.Contains(allow, uid) {
		return fmt.Errorf("transport: refusing a peer running as uid %d (this process runs as uid %d; Config.AllowUIDs admits others)", uid, os.Geteuid())
	}
	return nil
}
