package memcached

import (
	"encoding/base64"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/ubkit-io/ubkit/cache"
)

// Meta commands, as memcached 1.6.18's process_m*_command: the same
// checks in the same order, and return flags in the order the request
// gave them.

const (
	// maxMetaTokens is memcached's MFLAG_MAX_OPT_LENGTH: more tokens
	// than this (counting the command and the terminal one) is an error.
	maxMetaTokens = 20
	// maxOpaque bounds an O token, its letter included.
	maxOpaque = 32
)

// metaFlags are a meta command's flags: a letter and a token each.
type metaFlags struct {
	has   [128]bool
	tok   [128][]byte
	order [][]byte // the flag tokens, in the request's order
	// key is the key, base64-decoded with the b flag.
	key []byte
	// Parsed values.
	clientFlags               uint32
	exptime, autoviv, recache int32
	casv, initial, delta      uint64
	hasCAS, newTTL, noreply   bool
	mode                      byte
}

// preparse is memcached's _meta_flag_preparse over f[start:]: it returns
// memcached's error line, or "" when the flags are good. fatal errors
// (a duplicate or unknown flag) stop at once; the others let the caller
// go on as memcached does (ms still learns how much data to swallow).
func preparse(f [][]byte, start int) (metaFlags, string) {
	m := metaFlags{key: f[1], delta: 1}
	errstr := ""
	fail := func(s string) {
		if s != "" {
			errstr = s
		} else if errstr == "" {
			errstr = errBadFormat
		}
	}
	for _, t := range f[start:] {
		o := t[0]
		if o >= 127 || m.has[o] {
			return m, "CLIENT_ERROR duplicate flag"
		}
		m.has[o] = true
		m.tok[o] = t[1:]
		m.order = append(m.order, t)
		arg := t[1:]
		switch o {
		case 'b':
			m.key = base64Decode(f[1])
			if len(m.key) == 0 {
				fail("CLIENT_ERROR error decoding key")
			}
		case 'N', 'T', 'R':
			v, ok := safeStrtol(arg)
			if !ok {
				fail("CLIENT_ERROR bad token in command line format")
			}
			switch o {
			case 'N':
				m.autoviv = v
			case 'T':
				m.exptime, m.newTTL = v, true
			default:
				m.recache = v
			}
		case 'l', 'O', 'P', 'L', 'k', 's', 't', 'c', 'f', 'v', 'h', 'u', 'I':
		case 'q':
			m.noreply = true
		case 'F':
			v, ok := safeStrtoul(arg)
			if !ok {
				fail("")
			}
			m.clientFlags = v
		case 'C':
			v, ok := safeStrtoull(arg)
			if !ok {
				fail("CLIENT_ERROR bad token in command line format")
			} else {
				m.casv, m.hasCAS = v, true
			}
		case 'M':
			if len(t) != 2 {
				fail("CLIENT_ERROR incorrect length for M token")
			} else {
				m.mode = t[1]
			}
		case 'J':
			v, ok := safeStrtoull(arg)
			if !ok {
				fail("CLIENT_ERROR invalid numeric initial value")
			}
			m.initial = v
		case 'D':
			v, ok := safeStrtoull(arg)
			if !ok {
				fail("CLIENT_ERROR invalid numeric delta value")
			}
			m.delta = v
		default:
			return m, "CLIENT_ERROR invalid flag"
		}
	}
	return m, errstr
}

// base64Decode is memcached's base64_decode: bytes outside the alphabet
// are skipped, the others must come in groups of four, and padding ends
// the input. It returns nil where memcached's returns 0.
func base64Decode(src []byte) []byte {
	const invalid = 0x80
	val := func(c byte) byte {
		switch {
		case c >= 'A' && c <= 'Z':
			return c - 'A'
		case c >= 'a' && c <= 'z':
			return c - 'a' + 26
		case c >= '0' && c <= '9':
			return c - '0' + 52
		case c == '+':
			return 62
		case c == '/':
			return 63
		case c == '=':
			return 0
		}
		return invalid
	}
	count := 0
	for _, c := range src {
		if val(c) != invalid {
			count++
		}
	}
	if count == 0 || count%4 != 0 {
		return nil
	}
	out := make([]byte, 0, count/4*3)
	var block [4]byte
	n, pad := 0, 0
	for _, c := range src {
		v := val(c)
		if v == invalid {
			continue
		}
		if c == '=' {
			pad++
		}
		block[n] = v
		n++
		if n < 4 {
			continue
		}
		out = append(out, block[0]<<2|block[1]>>4, block[1]<<4|block[2]>>2, block[2]<<6|block[3])
		n = 0
		if pad > 0 {
			if pad > 2 {
				return nil
			}
			return out[:len(out)-pad]
		}
	}
	return out
}

// metaPrelude runs the checks every meta command starts with; it answers
// the client itself and returns false when they fail.
func (cn *conn) metaPrelude(f [][]byte, tooMany string) bool {
	if len(f) < 2 {
		cn.out("ERROR")
		return false
	}
	if len(f[1]) > maxKey {
		cn.outErr(errBadFormat)
		return false
	}
	if len(f)+1 > maxMetaTokens {
		cn.outErr(tooMany)
		return false
	}
	return true
}

// opaqueTooLong checks the O flag's length.
func (m *metaFlags) opaqueTooLong() bool { return m.has['O'] && len(m.tok['O'])+1 > maxOpaque }

// writeKeyFlags writes the O and k flags, for the answers that echo
// nothing else.
func (cn *conn) writeKeyFlags(m *metaFlags, f [][]byte) {
	for _, t := range m.order {
		cn.writeEcho(t, m, f)
	}
}

// writeEcho writes an O or k flag (others: nothing).
func (cn *conn) writeEcho(t []byte, m *metaFlags, f [][]byte) {
	switch t[0] {
	case 'O':
		cn.w.WriteByte(' ')
		cn.w.Write(t)
	case 'k':
		cn.w.WriteString(" k")
		if m.has['b'] {
			// The decoded key, encoded again (memcached's decoding skips
			// what is not base64, so this may differ from the request).
			cn.w.WriteString(base64.StdEncoding.EncodeToString(m.key))
			cn.w.WriteString(" b")
		} else {
			cn.w.Write(f[1])
		}
	}
}

// expiry is when an entry given exptime now expires (zero: never).
func expiry(exptime int32) time.Time {
	if ttl := ttlOf(exptime); ttl > 0 {
		return time.Now().Add(ttl)
	}
	return time.Time{}
}

// ttlFlag is the meta "t" return flag: seconds left, -1 for no expiry.
func ttlFlag(in cache.Info) string {
	ttl := int64(-1)
	if !in.Expires.IsZero() {
		ttl = max(int64(time.Until(in.Expires).Round(time.Second)/time.Second), 0)
	}
	return " t" + strconv.FormatInt(ttl, 10)
}

func (cn *conn) metaGet(f [][]byte) {
	if !cn.metaPrelude(f, "CLIENT_ERROR options flags are too long") {
		return
	}
	m, errstr := preparse(f, 2)
	if errstr != "" {
		cn.outErr(errstr)
		return
	}
	if m.opaqueTooLong() {
		cn.outErr("CLIENT_ERROR opaque token too long")
		return
	}
	p, st, key := cn.s.store(), &cn.s.st, m.key
	v, in, err := p.Get(cn.ctx, key, cn.scratch)
	cn.s.failed("mg", err)
	if m.newTTL {
		st.cmdTouch.Add(1)
	} else {
		st.cmdGet.Add(1)
	}
	if err != nil {
		if m.newTTL {
			st.touchMisses.Add(1)
		} else {
			st.getMisses.Add(1)
		}
		if m.noreply {
			return
		}
		cn.w.WriteString("EN")
		cn.writeKeyFlags(&m, f)
		cn.w.WriteString("\r\n")
		return
	}
	cn.scratch = v
	if m.newTTL {
		st.touchHits.Add(1)
		cn.s.failed("mg", p.Touch(cn.ctx, key, ttlOf(m.exptime)))
	} else {
		st.getHits.Add(1)
	}
	if m.has['v'] {
		cn.w.WriteString("VA ")
		cn.w.WriteString(strconv.Itoa(len(v)))
	} else {
		cn.w.WriteString("HD")
	}
	for _, t := range m.order {
		switch t[0] {
		case 'c':
			cn.w.WriteString(" c" + strconv.FormatUint(in.Version, 10))
		case 'f':
			cn.w.WriteString(" f" + strconv.FormatUint(uint64(in.Flags), 10))
		case 's':
			cn.w.WriteString(" s" + strconv.Itoa(len(v)))
		case 't':
			cn.w.WriteString(ttlFlag(in))
		case 'T':
			// memcached sets the new TTL where T stands: a t before it
			// shows the old one.
			in.Expires = expiry(m.exptime)
		default:
			cn.writeEcho(t, &m, f)
		}
	}
	cn.w.WriteString("\r\n")
	if m.has['v'] {
		cn.w.Write(v)
		cn.w.WriteString("\r\n")
	}
}

func (cn *conn) metaSet(f [][]byte) bool {
	if len(f) < 2 {
		cn.out("ERROR")
		return false
	}
	if len(f[1]) > maxKey || len(f) == 2 {
		// As memcached: the data block is not skipped.
		cn.outErr(errBadFormat)
		return false
	}
	if len(f)+1 > maxMetaTokens {
		cn.outErr("CLIENT_ERROR options flags too long")
		return false
	}
	vlen, ok := safeStrtol(f[2])
	if !ok || vlen < 0 || vlen > math.MaxInt32-2 {
		cn.outErr(errBadFormat)
		return false
	}
	n := int(vlen)
	swallow := func(errstr string) bool {
		cn.outErr(errstr)
		return !cn.discard(int64(n) + 2)
	}
	m, errstr := preparse(f, 3)
	if errstr != "" {
		return swallow(errstr)
	}
	if m.opaqueTooLong() {
		return swallow("CLIENT_ERROR opaque token too long")
	}
	cmd := "set"
	switch m.mode {
	case 0, 'S':
	case 'E':
		cmd = "add"
	case 'A':
		cmd = "append"
	case 'P':
		cmd = "prepend"
	case 'R':
		cmd = "replace"
	default:
		return swallow("CLIENT_ERROR invalid mode for ms M token")
	}
	if m.hasCAS && (cmd == "set" || cmd == "replace") {
		cmd = "cas"
	}
	st := &cn.s.st
	if cn.s.tooLarge(len(m.key), m.clientFlags, n) {
		st.storeTooLarge.Add(1)
		// Whatever the mode, memcached drops the old value.
		_, err := cn.s.store().Delete(cn.ctx, m.key)
		cn.s.failed("ms", err)
		return swallow(errTooLarge)
	}
	// The flags point into the read buffer, which the data will reuse.
	rawKey := append([]byte(nil), f[1]...)
	key := append([]byte(nil), m.key...)
	order := make([][]byte, len(m.order))
	for i, t := range m.order {
		order[i] = append([]byte(nil), t...)
	}
	m.order = order
	data, ok, closed := cn.readData(n)
	if closed {
		return true
	}
	st.cmdSet.Add(1)
	if !ok {
		cn.outErr("CLIENT_ERROR bad data chunk")
		return false
	}
	casv := uint64(0)
	if m.hasCAS {
		casv = m.casv
	}
	if cmd == "add" {
		casv = 0
	}
	res, ver := cn.s.storeItem(cn.ctx, cmd, key, data, m.clientFlags, ttlOf(m.exptime), casv, &cn.old)
	code := map[string]string{"STORED": "HD", "NOT_STORED": "NS", "EXISTS": "EX", "NOT_FOUND": "NF"}[res]
	if code == "" {
		cn.outErr(res)
		return false
	}
	if code == "HD" && m.noreply {
		return false
	}
	cn.w.WriteString(code)
	for _, t := range m.order {
		switch t[0] {
		case 'c':
			cn.w.WriteString(" c" + strconv.FormatUint(ver, 10))
		default:
			cn.writeEcho(t, &m, [][]byte{nil, rawKey})
		}
	}
	cn.w.WriteString("\r\n")
	return false
}

func (cn *conn) metaDelete(f [][]byte) {
	if !cn.metaPrelude(f, "CLIENT_ERROR options flags too long") {
		return
	}
	m, errstr := preparse(f, 2)
	if errstr != "" {
		cn.outErr("CLIENT_ERROR invalid or duplicate flag")
		return
	}
	if m.opaqueTooLong() {
		cn.outErr("CLIENT_ERROR opaque token too long")
		return
	}
	p, st := cn.s.store(), &cn.s.st
	code := "HD"
	if m.hasCAS {
		// Compare and delete under one lock: a write landing between a
		// check and a delete would be lost.
		switch err := p.DeleteIfVersion(cn.ctx, m.key, m.casv); {
		case errors.Is(err, cache.ErrNotFound):
			code = "NF"
		case errors.Is(err, cache.ErrExists):
			code = "EX"
		case err != nil:
			code = "NF"
		}
	} else {
		found, err := p.Delete(cn.ctx, m.key)
		cn.s.failed("md", err)
		if !found {
			code = "NF"
		}
	}
	if code == "HD" {
		st.deleteHits.Add(1)
	} else {
		st.deleteMisses.Add(1)
	}
	if code == "HD" && m.noreply {
		return
	}
	cn.w.WriteString(code)
	cn.writeKeyFlags(&m, f)
	cn.w.WriteString("\r\n")
}

func (cn *conn) metaArith(f [][]byte) {
	if !cn.metaPrelude(f, "CLIENT_ERROR options flags too long") {
		return
	}
	m, errstr := preparse(f, 2)
	if errstr != "" {
		cn.outErr("CLIENT_ERROR invalid or duplicate flag")
		return
	}
	incr := true
	switch m.mode {
	case 0, 'I', '+':
	case 'D', '-':
		incr = false
	default:
		cn.outErr("CLIENT_ERROR invalid mode for ma M token")
		return
	}
	if m.opaqueTooLong() {
		cn.outErr("CLIENT_ERROR opaque token too long")
		return
	}
	p, st, key := cn.s.store(), &cn.s.st, m.key
	// T is applied in the same write as the delta, and c and t describe
	// that write's item (or, for a t before T, the item before it).
	var ttl *time.Duration
	if m.newTTL {
		d := ttlOf(m.exptime)
		ttl = &d
	}
	v, before, after, fail := cn.s.addDeltaTTL(cn.ctx, key, incr, m.delta, m.casv, &cn.old, ttl)
	created := false
	if fail == deltaNotFound && m.has['N'] {
		// Autovivify with J (default 0) and N's TTL, or T's if T comes
		// after N (the later flag wins, as in memcached).
		life := ttlOf(m.autoviv)
		if m.newTTL && flagAfter(m.order, 'T', 'N') {
			life = ttlOf(m.exptime)
		}
		ver, err := p.Set(cn.ctx, key, strconv.AppendUint(nil, m.initial, 10), cache.SetOptions{Mode: cache.IfAbsent, TTL: life})
		if err == nil {
			st.totalItems.Add(1)
			v, fail, created = m.initial, "", true
			after = cache.Info{Version: ver}
			before = after
		} else {
			v, before, after, fail = cn.s.addDeltaTTL(cn.ctx, key, incr, m.delta, m.casv, &cn.old, ttl)
		}
	}
	switch {
	case fail == deltaCASMismatch:
		cn.w.WriteString("EX")
		cn.writeKeyFlags(&m, f)
		cn.w.WriteString("\r\n")
		return
	case fail == deltaNotFound:
		if incr {
			st.incrMisses.Add(1)
		} else {
			st.decrMisses.Add(1)
		}
		cn.w.WriteString("NF")
		cn.writeKeyFlags(&m, f)
		cn.w.WriteString("\r\n")
		return
	case fail != "":
		cn.outErr(fail)
		return
	}
	if !created {
		if incr {
			st.incrHits.Add(1)
		} else {
			st.decrHits.Add(1)
		}
	}
	if m.noreply && !created {
		return
	}
	num := strconv.FormatUint(v, 10)
	if m.has['v'] {
		cn.w.WriteString("VA " + strconv.Itoa(len(num)))
	} else {
		cn.w.WriteString("HD")
	}
	// t reports the expiry as the flags before it left it: the item's
	// before the write, then T's, then (for a created item) N's.
	cur := before
	if created {
		cur.Expires = time.Time{} // until N, as memcached
	}
	for _, t := range m.order {
		switch t[0] {
		case 'c':
			cn.w.WriteString(" c" + strconv.FormatUint(after.Version, 10))
		case 't':
			cn.w.WriteString(ttlFlag(cur))
		case 'T':
			cur.Expires = expiry(m.exptime)
		case 'N':
			if created {
				cur.Expires = expiry(m.autoviv)
			}
		default:
			cn.writeEcho(t, &m, f)
		}
	}
	cn.w.WriteString("\r\n")
	if m.has['v'] {
		cn.w.WriteString(num + "\r\n")
	}
}

// flagAfter says whether flag a comes after flag b in a meta command.
func flagAfter(order [][]byte, a, b byte) bool {
	ia, ib := -1, -1
	for i, t := range order {
		switch t[0] {
		case a:
			ia = i
		case b:
			ib = i
		}
	}
	return ia > ib
}
