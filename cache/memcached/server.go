// Package memcached serves a cache.Pool over the memcached text protocol,
// meta commands included (mg, ms, md, ma, mn), so any memcached client can
// use the shared pool over TCP or a unix socket.
//
// Classic commands: get, gets, gat, gats, set, add, replace, append,
// prepend, cas, delete, incr, decr, touch, flush_all, version, verbosity,
// stats, quit. Errors follow memcached 1.6: ERROR for an unknown command,
// CLIENT_ERROR for a malformed line, key or data chunk (the connection
// goes on wherever the protocol lets it find the next command), and
// SERVER_ERROR object too large for cache for a value beyond the pool's
// limit (its data is read and dropped).
package memcached

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/cache"
)

// Limits, as memcached's.
const (
	maxKey  = 250
	maxLine = 2048
)

// Version is what the version command answers.
const Version = "1.6.18-ubkit"

// Server serves a pool.
type Server struct {
	Pool *cache.Pool

	mu     sync.Mutex
	ls     map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	start  time.Time
}

// NewServer returns a server for p.
func NewServer(p *cache.Pool) *Server {
	return &Server{Pool: p, ls: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}, start: time.Now()}
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.ls[l] = struct{}{}
	s.mu.Unlock()
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			delete(s.ls, l)
			s.mu.Unlock()
			if closed {
				return net.ErrClosed
			}
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.ServeConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops the listeners and connections and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for l := range s.ls {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// conn is one client connection.
type conn struct {
	s       *Server
	r       *bufio.Reader
	w       *bufio.Writer
	scratch []byte
	args    [][]byte
}

// ServeConn speaks the protocol on c until the client quits, the
// connection fails, or a line cannot be resynchronized.
func (s *Server) ServeConn(c net.Conn) {
	defer c.Close()
	cn := &conn{s: s, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
	for {
		line, err := cn.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || (err == nil && len(line) > maxLine) {
			cn.w.WriteString("CLIENT_ERROR line too long\r\n")
			cn.w.Flush()
			return
		}
		if err != nil {
			cn.w.Flush()
			return
		}
		line = bytes.TrimRight(line, "\r\n")
		quit := cn.command(line)
		// Answer a pipeline once it is read.
		if cn.r.Buffered() == 0 || quit {
			if cn.w.Flush() != nil {
				return
			}
		}
		if quit {
			return
		}
	}
}

func (cn *conn) fields(line []byte) [][]byte {
	cn.args = cn.args[:0]
	for len(line) > 0 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			cn.args = append(cn.args, line)
			break
		}
		if i > 0 {
			cn.args = append(cn.args, line[:i])
		}
		line = line[i+1:]
	}
	return cn.args
}

// command runs one line; it reports whether the connection should end.
func (cn *conn) command(line []byte) bool {
	f := cn.fields(line)
	if len(f) == 0 {
		cn.w.WriteString("ERROR\r\n")
		return false
	}
	switch string(f[0]) {
	case "get", "gets":
		cn.retrieve(f[1:], string(f[0]) == "gets", false, 0)
	case "gat", "gats":
		if len(f) < 3 {
			cn.w.WriteString("ERROR\r\n")
			return false
		}
		ttl, ok := exptime(f[1])
		if !ok {
			cn.clientError("invalid exptime argument")
			return false
		}
		cn.retrieve(f[2:], string(f[0]) == "gats", true, ttl)
	case "set", "add", "replace", "append", "prepend", "cas":
		return cn.store(f)
	case "delete":
		cn.delete(f)
	case "incr", "decr":
		cn.arith(f)
	case "touch":
		cn.touch(f)
	case "flush_all":
		cn.flush(f)
	case "version":
		cn.w.WriteString("VERSION " + Version + "\r\n")
	case "verbosity":
		if !noreply(f) {
			cn.w.WriteString("OK\r\n")
		}
	case "stats":
		cn.stats()
	case "quit":
		return true
	case "mn":
		cn.w.WriteString("MN\r\n")
	case "mg":
		cn.metaGet(f)
	case "ms":
		return cn.metaSet(f)
	case "md":
		cn.metaDelete(f)
	case "ma":
		cn.metaArith(f)
	default:
		cn.w.WriteString("ERROR\r\n")
	}
	return false
}

func (cn *conn) clientError(msg string) { cn.w.WriteString("CLIENT_ERROR " + msg + "\r\n") }

func noreply(f [][]byte) bool { return len(f) > 0 && string(f[len(f)-1]) == "noreply" }

func validKey(k []byte) bool {
	if len(k) == 0 || len(k) > maxKey {
		return false
	}
	for _, c := range k {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// exptime turns memcached's exptime (seconds; beyond 30 days a unix time;
// negative: already expired) into a TTL: 0 never expires, <0 expired.
func exptime(b []byte) (time.Duration, bool) {
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, false
	}
	return cache.ExpTime(v), true
}

func (cn *conn) retrieve(keys [][]byte, withCAS, touch bool, ttl time.Duration) {
	if len(keys) == 0 {
		cn.w.WriteString("ERROR\r\n")
		return
	}
	for _, k := range keys {
		if !validKey(k) {
			cn.clientError("bad command line format")
			return
		}
	}
	p := cn.s.Pool
	for _, k := range keys {
		if touch {
			if ttl < 0 {
				p.Delete(k)
				continue
			}
			if p.Touch(k, ttl) != nil {
				continue
			}
		}
		v, in, err := p.Get(k, cn.scratch)
		if err != nil {
			continue
		}
		cn.scratch = v
		cn.w.WriteString("VALUE ")
		cn.w.Write(k)
		cn.w.WriteByte(' ')
		cn.w.WriteString(strconv.FormatUint(uint64(in.Flags), 10))
		cn.w.WriteByte(' ')
		cn.w.WriteString(strconv.Itoa(len(v)))
		if withCAS {
			cn.w.WriteByte(' ')
			cn.w.WriteString(strconv.FormatUint(in.Version, 10))
		}
		cn.w.WriteString("\r\n")
		cn.w.Write(v)
		cn.w.WriteString("\r\n")
	}
	cn.w.WriteString("END\r\n")
}

// readData reads a data block of n bytes and its \r\n. ok is false (and a
// CLIENT_ERROR written) when the block does not end properly; closed when
// the connection ended.
func (cn *conn) readData(n int) (data []byte, ok, closed bool) {
	if cap(cn.scratch) < n+2 {
		cn.scratch = make([]byte, n+2)
	}
	data = cn.scratch[:n+2]
	if _, err := io.ReadFull(cn.r, data); err != nil {
		return nil, false, true
	}
	if data[n] != '\r' || data[n+1] != '\n' {
		cn.clientError("bad data chunk")
		return nil, false, false
	}
	return data[:n], true, false
}

// discard drops a too-large value's data block.
func (cn *conn) discard(n int64) bool {
	_, err := io.CopyN(io.Discard, cn.r, n+2)
	return err == nil
}

func (cn *conn) store(f [][]byte) bool {
	cmd := string(f[0])
	want := 5
	if cmd == "cas" {
		want = 6
	}
	if len(f) != want && (len(f) != want+1 || !noreply(f)) {
		cn.w.WriteString("ERROR\r\n")
		return false
	}
	quiet := noreply(f)
	key := f[1]
	flags, err1 := strconv.ParseUint(string(f[2]), 10, 32)
	ttl, ok := exptime(f[3])
	n, err2 := strconv.ParseInt(string(f[4]), 10, 64)
	var casv uint64
	var err3 error
	if cmd == "cas" {
		casv, err3 = strconv.ParseUint(string(f[5]), 10, 64)
	}
	if err1 != nil || !ok || err2 != nil || n < 0 || err3 != nil || !validKey(key) {
		// As memcached: the data block is not skipped, and its lines are
		// taken for commands.
		cn.clientError("bad command line format")
		return false
	}
	if n+int64(len(key)) > int64(cn.s.Pool.MaxValue()) {
		cn.w.WriteString("SERVER_ERROR object too large for cache\r\n")
		return !cn.discard(n)
	}
	key = append([]byte(nil), key...) // f points into the read buffer
	data, ok, closed := cn.readData(int(n))
	if closed {
		return true
	}
	if !ok {
		return false
	}
	res := cn.s.set(cmd, key, data, uint32(flags), ttl, casv)
	if !quiet {
		cn.w.WriteString(res + "\r\n")
	}
	return false
}

// set runs a storage command and returns memcached's answer.
func (s *Server) set(cmd string, key, data []byte, flags uint32, ttl time.Duration, casv uint64) string {
	p := s.Pool
	if ttl < 0 {
		// Stored already expired: it replaces what was there, then is gone.
		if cmd == "set" || cmd == "cas" {
			p.Delete(key)
		}
		return "STORED"
	}
	o := cache.SetOptions{TTL: ttl, Flags: flags}
	switch cmd {
	case "add":
		o.Mode = cache.IfAbsent
	case "replace":
		o.Mode = cache.IfPresent
	case "cas":
		o.Mode, o.Version = cache.IfVersion, casv
	case "append", "prepend":
		err := p.Append(key, data, cmd == "prepend")
		switch {
		case err == nil:
			return "STORED"
		case errors.Is(err, cache.ErrNotFound):
			return "NOT_STORED"
		case errors.Is(err, cache.ErrTooLarge):
			return "SERVER_ERROR object too large for cache"
		}
		return "SERVER_ERROR " + err.Error()
	}
	_, err := p.Set(key, data, o)
	switch {
	case err == nil:
		return "STORED"
	case errors.Is(err, cache.ErrExists):
		if cmd == "cas" {
			return "EXISTS"
		}
		return "NOT_STORED"
	case errors.Is(err, cache.ErrNotFound):
		if cmd == "cas" {
			return "NOT_FOUND"
		}
		return "NOT_STORED"
	case errors.Is(err, cache.ErrTooLarge):
		return "SERVER_ERROR object too large for cache"
	}
	return "SERVER_ERROR out of memory storing object"
}

func (cn *conn) delete(f [][]byte) {
	// "delete <key> [0] [noreply]": memcached still accepts a zero time.
	if len(f) < 2 || len(f) > 4 || !validKey(f[1]) {
		cn.w.WriteString("ERROR\r\n")
		return
	}
	quiet := noreply(f)
	if extra := len(f) - 2; extra > 1 || (extra == 1 && !quiet && string(f[2]) != "0") {
		cn.clientError("bad command line format.  Usage: delete <key> [noreply]")
		return
	}
	found, _ := cn.s.Pool.Delete(f[1])
	if quiet {
		return
	}
	if found {
		cn.w.WriteString("DELETED\r\n")
	} else {
		cn.w.WriteString("NOT_FOUND\r\n")
	}
}

// incr runs incr or decr and returns the result, or memcached's answer
// for a failure.
func (s *Server) incr(key []byte, delta uint64, decr bool) (uint64, string) {
	v, err := s.Pool.Incr(key, delta, decr)
	switch {
	case err == nil:
		return v, ""
	case errors.Is(err, cache.ErrNotFound):
		return 0, "NOT_FOUND"
	case errors.Is(err, cache.ErrNotNumber):
		return 0, "CLIENT_ERROR cannot increment or decrement non-numeric value"
	}
	return 0, "SERVER_ERROR " + err.Error()
}

func (cn *conn) arith(f [][]byte) {
	if len(f) != 3 && (len(f) != 4 || !noreply(f)) {
		cn.w.WriteString("ERROR\r\n")
		return
	}
	if !validKey(f[1]) {
		cn.clientError("bad command line format")
		return
	}
	delta, err := strconv.ParseUint(string(f[2]), 10, 64)
	if err != nil {
		cn.clientError("invalid numeric delta argument")
		return
	}
	v, fail := cn.s.incr(f[1], delta, string(f[0]) == "decr")
	if noreply(f) {
		return
	}
	if fail != "" {
		cn.w.WriteString(fail + "\r\n")
		return
	}
	cn.w.WriteString(strconv.FormatUint(v, 10) + "\r\n")
}

func (cn *conn) touch(f [][]byte) {
	if len(f) != 3 && (len(f) != 4 || !noreply(f)) {
		cn.w.WriteString("ERROR\r\n")
		return
	}
	ttl, ok := exptime(f[2])
	if !ok || !validKey(f[1]) {
		cn.clientError("invalid exptime argument")
		return
	}
	var err error
	if ttl < 0 {
		var found bool
		found, err = cn.s.Pool.Delete(f[1])
		if !found {
			err = cache.ErrNotFound
		}
	} else {
		err = cn.s.Pool.Touch(f[1], ttl)
	}
	if noreply(f) {
		return
	}
	if err != nil {
		cn.w.WriteString("NOT_FOUND\r\n")
		return
	}
	cn.w.WriteString("TOUCHED\r\n")
}

func (cn *conn) flush(f [][]byte) {
	args := f[1:]
	quiet := noreply(f)
	if quiet {
		args = args[:len(args)-1]
	}
	delay := int64(0)
	if len(args) > 1 {
		cn.w.WriteString("ERROR\r\n")
		return
	}
	if len(args) == 1 {
		var err error
		if delay, err = strconv.ParseInt(string(args[0]), 10, 64); err != nil {
			cn.clientError("bad command line format")
			return
		}
	}
	if delay > 0 {
		time.AfterFunc(time.Duration(delay)*time.Second, func() { cn.s.Pool.Flush() })
	} else {
		cn.s.Pool.Flush()
	}
	if !quiet {
		cn.w.WriteString("OK\r\n")
	}
}

func (cn *conn) stats() {
	st := cn.s.Pool.Stats()
	w := func(k string, v any) { fmt.Fprintf(cn.w, "STAT %s %v\r\n", k, v) }
	w("pid", 0)
	w("uptime", int64(time.Since(cn.s.start).Seconds()))
	w("time", time.Now().Unix())
	w("version", Version)
	w("curr_items", st.Items)
	w("bytes", st.Bytes)
	w("limit_maxbytes", st.MaxBytes)
	w("get_hits", st.Hits)
	w("get_misses", st.Misses)
	w("cmd_set", st.Sets)
	w("delete_hits", st.Deletes)
	w("evictions", st.Evictions)
	w("expired_unfetched", st.Expired)
	cn.w.WriteString("END\r\n")
}

// Meta commands.

// metaFlags splits meta flags: a letter and an optional token.
type metaFlags struct {
	b      bool
	has    [128]bool
	tok    [128][]byte
	order  []byte
	opaque []byte
}

func parseMeta(f [][]byte) (metaFlags, bool) {
	var m metaFlags
	for _, a := range f {
		c := a[0]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter {
			return m, false
		}
		if m.has[c] {
			return m, false // duplicate flag
		}
		m.has[c] = true
		m.tok[c] = a[1:]
		m.order = append(m.order, c)
	}
	m.b = m.has['b']
	m.opaque = m.tok['O']
	return m, true
}

// metaKey decodes the key (base64 with the b flag).
func metaKey(k []byte, m metaFlags) ([]byte, bool) {
	if m.b {
		d := make([]byte, base64.StdEncoding.DecodedLen(len(k)))
		n, err := base64.StdEncoding.Decode(d, k)
		if err != nil || n == 0 || n > maxKey {
			return nil, false
		}
		return d[:n], true
	}
	return k, validKey(k)
}

// metaArgs parses a meta command's key and flags ("<cmd> <key> <flag>*"),
// answering the client itself when they are bad.
func (cn *conn) metaArgs(f [][]byte) (metaFlags, []byte, bool) {
	if len(f) < 2 {
		cn.clientError("bad command line format")
		return metaFlags{}, nil, false
	}
	m, ok := parseMeta(f[2:])
	if !ok {
		cn.clientError("invalid flag")
		return m, nil, false
	}
	key, ok := metaKey(f[1], m)
	if !ok {
		cn.keyError(m)
		return m, nil, false
	}
	return m, key, true
}

func (cn *conn) keyError(m metaFlags) {
	if m.b {
		cn.clientError("error decoding key")
	} else {
		cn.clientError("bad command line format")
	}
}

// ttlFlag is the meta "t" return flag: seconds left, -1 for no expiry.
func ttlFlag(in cache.Info) string {
	ttl := int64(-1)
	if !in.Expires.IsZero() {
		ttl = max(int64(time.Until(in.Expires).Round(time.Second)/time.Second), 0)
	}
	return " t" + strconv.FormatInt(ttl, 10)
}

// retFlags writes the flags every meta answer echoes (O, k, b).
func (cn *conn) retFlags(m metaFlags, rawKey []byte) {
	if m.has['O'] {
		cn.w.WriteString(" O")
		cn.w.Write(m.opaque)
	}
	if m.has['k'] {
		cn.w.WriteString(" k")
		cn.w.Write(rawKey)
		if m.b {
			cn.w.WriteString(" b")
		}
	}
}

func (cn *conn) metaGet(f [][]byte) {
	m, key, ok := cn.metaArgs(f)
	if !ok {
		return
	}
	p := cn.s.Pool
	if m.has['T'] {
		ttl, ok := exptime(m.tok['T'])
		if !ok {
			cn.clientError("bad token in command line format")
			return
		}
		if ttl < 0 {
			p.Delete(key)
		} else {
			p.Touch(key, ttl)
		}
	}
	v, in, err := p.Get(key, cn.scratch)
	if err != nil {
		if !m.has['q'] {
			cn.w.WriteString("EN\r\n")
		}
		return
	}
	cn.scratch = v
	if m.has['v'] {
		cn.w.WriteString("VA ")
		cn.w.WriteString(strconv.Itoa(len(v)))
	} else {
		cn.w.WriteString("HD")
	}
	for _, c := range m.order {
		switch c {
		case 'c':
			cn.w.WriteString(" c" + strconv.FormatUint(in.Version, 10))
		case 'f':
			cn.w.WriteString(" f" + strconv.FormatUint(uint64(in.Flags), 10))
		case 's':
			cn.w.WriteString(" s" + strconv.Itoa(len(v)))
		case 't':
			cn.w.WriteString(ttlFlag(in))
		}
	}
	cn.retFlags(m, f[1])
	cn.w.WriteString("\r\n")
	if m.has['v'] {
		cn.w.Write(v)
		cn.w.WriteString("\r\n")
	}
}

func (cn *conn) metaSet(f [][]byte) bool {
	if len(f) < 3 {
		cn.clientError("bad command line format")
		return false
	}
	n, err := strconv.ParseInt(string(f[2]), 10, 64)
	if err != nil || n < 0 {
		cn.clientError("bad data chunk")
		return false
	}
	m, ok := parseMeta(f[3:])
	if !ok {
		cn.clientError("invalid flag")
		return !cn.discard(n)
	}
	key, ok := metaKey(f[1], m)
	if !ok {
		cn.keyError(m)
		return !cn.discard(n)
	}
	if n+int64(len(key)) > int64(cn.s.Pool.MaxValue()) {
		cn.w.WriteString("SERVER_ERROR object too large for cache\r\n")
		return !cn.discard(n)
	}
	var flags uint64
	if m.has['F'] {
		if flags, err = strconv.ParseUint(string(m.tok['F']), 10, 32); err != nil {
			cn.clientError("bad token in command line format")
			return !cn.discard(n)
		}
	}
	ttl := time.Duration(0)
	if m.has['T'] {
		if ttl, ok = exptime(m.tok['T']); !ok {
			cn.clientError("bad token in command line format")
			return !cn.discard(n)
		}
	}
	cmd := "set"
	if m.has['M'] {
		switch string(m.tok['M']) {
		case "E", "e":
			cmd = "add"
		case "A", "a":
			cmd = "append"
		case "P", "p":
			cmd = "prepend"
		case "R", "r":
			cmd = "replace"
		case "S", "s":
		default:
			cn.clientError("invalid mode for ms")
			return !cn.discard(n)
		}
	}
	var casv uint64
	if m.has['C'] {
		if casv, err = strconv.ParseUint(string(m.tok['C']), 10, 64); err != nil {
			cn.clientError("bad token in command line format")
			return !cn.discard(n)
		}
		if cmd == "set" {
			cmd = "cas"
		}
	}
	rawKey := append([]byte(nil), f[1]...)
	key = append([]byte(nil), key...)
	order, opaque := append([]byte(nil), m.order...), append([]byte(nil), m.opaque...)
	data, ok, closed := cn.readData(int(n))
	if closed {
		return true
	}
	if !ok {
		return false
	}
	res := cn.s.set(cmd, key, data, uint32(flags), ttl, casv)
	code := map[string]string{"STORED": "HD", "NOT_STORED": "NS", "EXISTS": "EX", "NOT_FOUND": "NF"}[res]
	if code == "" {
		cn.w.WriteString(res + "\r\n")
		return false
	}
	if code == "HD" && m.has['q'] {
		return false
	}
	m.order, m.opaque = order, opaque
	cn.w.WriteString(code)
	if m.has['c'] && code == "HD" {
		if _, in, err := cn.s.Pool.Get(key, nil); err == nil {
			cn.w.WriteString(" c" + strconv.FormatUint(in.Version, 10))
		}
	}
	cn.retFlags(m, rawKey)
	cn.w.WriteString("\r\n")
	return false
}

func (cn *conn) metaDelete(f [][]byte) {
	m, key, ok := cn.metaArgs(f)
	if !ok {
		return
	}
	p := cn.s.Pool
	code := "HD"
	if m.has['C'] {
		casv, err := strconv.ParseUint(string(m.tok['C']), 10, 64)
		if err != nil {
			cn.clientError("bad token in command line format")
			return
		}
		if _, in, err := p.Get(key, nil); err != nil {
			code = "NF"
		} else if in.Version != casv {
			code = "EX"
		}
	}
	if code == "HD" {
		if found, _ := p.Delete(key); !found {
			code = "NF"
		}
	}
	if code == "HD" && m.has['q'] {
		return
	}
	cn.w.WriteString(code)
	cn.retFlags(m, f[1])
	cn.w.WriteString("\r\n")
}

func (cn *conn) metaArith(f [][]byte) {
	m, key, ok := cn.metaArgs(f)
	if !ok {
		return
	}
	delta := uint64(1)
	var err error
	if m.has['D'] {
		if delta, err = strconv.ParseUint(string(m.tok['D']), 10, 64); err != nil {
			cn.clientError("invalid numeric delta argument")
			return
		}
	}
	decr := false
	if m.has['M'] {
		switch string(m.tok['M']) {
		case "I", "i", "+":
		case "D", "d", "-":
			decr = true
		default:
			cn.clientError("invalid mode for ma")
			return
		}
	}
	v, fail := cn.s.incr(key, delta, decr)
	if fail == "NOT_FOUND" && m.has['N'] {
		// Autovivify with J (initial value, default 0) and N's TTL.
		initial := uint64(0)
		if m.has['J'] {
			if initial, err = strconv.ParseUint(string(m.tok['J']), 10, 64); err != nil {
				cn.clientError("invalid numeric initial value")
				return
			}
		}
		ttl, ok := exptime(m.tok['N'])
		if !ok {
			cn.clientError("bad token in command line format")
			return
		}
		_, err := cn.s.Pool.Set(key, strconv.AppendUint(nil, initial, 10), cache.SetOptions{Mode: cache.IfAbsent, TTL: max(ttl, 0)})
		if err == nil {
			v, fail = initial, ""
		} else {
			v, fail = cn.s.incr(key, delta, decr)
		}
	}
	switch {
	case fail == "NOT_FOUND":
		if !m.has['q'] {
			cn.w.WriteString("NF")
			cn.retFlags(m, f[1])
			cn.w.WriteString("\r\n")
		}
		return
	case fail != "":
		cn.w.WriteString(fail + "\r\n")
		return
	}
	if m.has['q'] && !m.has['v'] {
		return
	}
	num := strconv.FormatUint(v, 10)
	if m.has['v'] {
		cn.w.WriteString("VA " + strconv.Itoa(len(num)))
	} else {
		cn.w.WriteString("HD")
	}
	if m.has['c'] || m.has['t'] {
		if _, in, err := cn.s.Pool.Get(key, nil); err == nil {
			if m.has['c'] {
				cn.w.WriteString(" c" + strconv.FormatUint(in.Version, 10))
			}
			if m.has['t'] {
				cn.w.WriteString(ttlFlag(in))
			}
		}
	}
	cn.retFlags(m, f[1])
	cn.w.WriteString("\r\n")
	if m.has['v'] {
		cn.w.WriteString(num + "\r\n")
	}
}
