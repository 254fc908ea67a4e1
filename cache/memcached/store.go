package memcached

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/ubkit-io/ubkit/cache"
)

// memcached's item size limit (-I, default 1m) counts more than the key
// and the value: an item is a 48-byte header, the key and a NUL, 4 bytes
// of flags unless they are 0, the value and its "\r\n", and an 8-byte
// CAS. With a 1-byte key and flags 0, memcached takes values of up to
// 1,048,516 bytes and refuses 1,048,517.
const (
	itemSizeMax    = 1 << 20
	itemHeader     = 48
	itemCAS        = 8
	slabChunkMax   = itemSizeMax / 2 // larger items are chunked
	errTooLarge    = "SERVER_ERROR object too large for cache"
	errOutOfMemory = "SERVER_ERROR out of memory storing object"
	errUnreadable  = "SERVER_ERROR the item could not be read, try again"
)

// itemSize is the bytes memcached's item for key, flags and a value of n
// bytes takes.
func itemSize(nkey int, flags uint32, n int) int {
	size := itemHeader + nkey + 1 + n + 2 + itemCAS
	if flags != 0 {
		size += 4
	}
	return size
}

// tooLarge says whether memcached would refuse the item, or the pool
// cannot hold it.
func (s *Server) tooLarge(nkey int, flags uint32, n int) bool {
	return itemSize(nkey, flags, n) > itemSizeMax || nkey+n > s.store().MaxValue()
}

// ttlOf turns a parsed exptime into a TTL for the pool. An item stored
// already expired (negative exptime, or a unix time in the past) is
// stored with the shortest TTL, so that it takes the place of what was
// there exactly as memcached's does, and is then gone.
func ttlOf(exptime int32) time.Duration {
	ttl := cache.ExpTime(int64(exptime))
	if ttl < 0 {
		return time.Nanosecond
	}
	return ttl
}

// keep is the SetOptions that replaces an entry as a compare-and-swap
// on its version, keeping its flags and expiry (append and incr do).
func keep(in cache.Info) cache.SetOptions {
	o := cache.SetOptions{Mode: cache.IfVersion, Version: in.Version, Flags: in.Flags}
	if !in.Expires.IsZero() {
		o.TTL = max(time.Until(in.Expires), time.Nanosecond)
	}
	return o
}

// store runs set, add, replace, append, prepend and cas, as memcached's
// process_update_command and complete_nread_ascii.
func (cn *conn) store(cmd string, tokens [][]byte) bool {
	cn.setNoreply(tokens)
	key := tokens[1]
	if len(key) > maxKey {
		// The data block is not skipped: memcached takes its lines for
		// commands.
		cn.out(errBadFormat)
		return false
	}
	flags, ok1 := safeStrtoul(tokens[2])
	exptime, ok2 := safeStrtol(tokens[3])
	vlen, ok3 := safeStrtol(tokens[4])
	if !ok1 || !ok2 || !ok3 {
		cn.out(errBadFormat)
		return false
	}
	var casv uint64
	if cmd == "cas" {
		var ok bool
		if casv, ok = safeStrtoull(tokens[5]); !ok {
			cn.out(errBadFormat)
			return false
		}
	}
	if vlen < 0 || vlen > math.MaxInt32-2 {
		cn.out(errBadFormat)
		return false
	}
	n := int(vlen)
	st := &cn.s.st
	if cn.s.tooLarge(len(key), flags, n) {
		st.storeTooLarge.Add(1)
		cn.out(errTooLarge)
		if cmd == "set" {
			// memcached drops the old value rather than leave it stale.
			_, err := cn.s.store().Delete(cn.ctx, key)
			cn.s.failed("set", err)
		}
		return !cn.discard(int64(n) + 2)
	}
	key = append(cn.key[:0], key...) // tokens point into the read buffer
	cn.key = key
	data, ok, closed := cn.readData(n)
	if closed {
		return true
	}
	st.cmdSet.Add(1)
	if !ok {
		cn.out("CLIENT_ERROR bad data chunk")
		return false
	}
	res, _ := cn.s.storeItem(cn.ctx, cmd, key, data, flags, ttlOf(exptime), casv, &cn.old)
	cn.out(res)
	return false
}

// storeItem stores as memcached's do_store_item and returns its answer
// and, when stored, the entry's version. buf is scratch space for append
// and prepend.
func (s *Server) storeItem(ctx context.Context, cmd string, key, data []byte, flags uint32, ttl time.Duration, casv uint64, buf *[]byte) (string, uint64) {
	p, st := s.store(), &s.st
	o := cache.SetOptions{TTL: ttl, Flags: flags}
	switch cmd {
	case "add":
		o.Mode = cache.IfAbsent
	case "replace":
		o.Mode = cache.IfPresent
	case "append", "prepend":
		return s.appendItem(ctx, key, data, cmd == "prepend", casv, buf)
	case "cas":
		if casv == 0 {
			// memcached has no item of CAS 0 to match.
			_, found, err := p.Version(ctx, key)
			if err != nil {
				// A bucket a stopped writer holds, or the connection
				// closing: memcached has neither, and no answer for it.
				s.failed(cmd, err)
				return errUnreadable, 0
			}
			if found {
				st.casBadval.Add(1)
				return "EXISTS", 0
			}
			st.casMisses.Add(1)
			return "NOT_FOUND", 0
		}
		o.Mode, o.Version = cache.IfVersion, casv
	}
	ver, err := p.Set(ctx, key, data, o)
	switch {
	case err == nil:
		st.totalItems.Add(1)
		if cmd == "cas" {
			st.casHits.Add(1)
		}
		return "STORED", ver
	case errors.Is(err, cache.ErrExists):
		if cmd == "cas" {
			st.casBadval.Add(1)
			return "EXISTS", 0
		}
		return "NOT_STORED", 0
	case errors.Is(err, cache.ErrNotFound):
		if cmd == "cas" {
			st.casMisses.Add(1)
			return "NOT_FOUND", 0
		}
		return "NOT_STORED", 0
	case errors.Is(err, cache.ErrTooLarge):
		st.storeTooLarge.Add(1)
		return errTooLarge, 0
	}
	s.failed(cmd, err)
	st.storeNoMemory.Add(1)
	if cmd == "set" {
		_, err := p.Delete(ctx, key)
		s.failed(cmd, err)
	}
	return errOutOfMemory, 0
}

// appendItem runs append and prepend: the old value's flags and expiry
// stay, and a result past the item size limit is NOT_STORED with the old
// value left as it was (memcached's allocation of the joined item fails).
// casv, from meta set, must match the old value's version unless 0.
func (s *Server) appendItem(ctx context.Context, key, data []byte, prepend bool, casv uint64, buf *[]byte) (string, uint64) {
	p := s.store()
	for {
		old, in, err := p.Get(ctx, key, (*buf)[:0])
		if err != nil {
			s.failed("append", err)
			return "NOT_STORED", 0
		}
		*buf = old
		if casv != 0 && casv != in.Version {
			return "EXISTS", 0
		}
		if s.tooLarge(len(key), in.Flags, len(old)+len(data)) {
			return "NOT_STORED", 0
		}
		var v []byte
		if prepend {
			v = append(append(make([]byte, 0, len(old)+len(data)), data...), old...)
		} else {
			v = append(old, data...)
		}
		*buf = v
		ver, err := p.Set(ctx, key, v, keep(in))
		switch {
		case err == nil:
			s.st.totalItems.Add(1)
			return "STORED", ver
		case errors.Is(err, cache.ErrExists), errors.Is(err, cache.ErrNotFound):
			continue // changed meanwhile: again
		}
		s.failed("append", err)
		return "NOT_STORED", 0
	}
}

// Answers of addDelta besides a number.
const (
	deltaNotFound   = "NOT_FOUND"
	deltaNonNumeric = "CLIENT_ERROR cannot increment or decrement non-numeric value"
	deltaNoMemory   = "SERVER_ERROR out of memory"
	// deltaCASMismatch: meta arithmetic's C flag named another version.
	deltaCASMismatch = "EX"
)

// addDelta runs incr or decr as memcached's do_add_delta: the value is
// parsed by strtoull (white space around it allowed), the sum wraps at 64
// bits, a difference stops at 0, and a result no longer than the old
// value is padded with spaces to its length. It returns the new value,
// or the failure's answer.
// casv, from meta arithmetic, must match the value's version unless 0.
func (s *Server) addDelta(ctx context.Context, key []byte, incr bool, delta, casv uint64, buf *[]byte) (uint64, string) {
	v, _, _, fail := s.addDeltaTTL(ctx, key, incr, delta, casv, buf, nil)
	return v, fail
}

// addDeltaTTL is addDelta that can also set the entry's time to live in
// the same write (ttl non-nil), and returns the entry as it was before
// and as it is after, so that ma's c and t flags describe its own item.
func (s *Server) addDeltaTTL(ctx context.Context, key []byte, incr bool, delta, casv uint64, buf *[]byte, ttl *time.Duration) (uint64, cache.Info, cache.Info, string) {
	p := s.store()
	for {
		old, in, err := p.Get(ctx, key, (*buf)[:0])
		if err != nil {
			s.failed("incr", err)
			return 0, in, in, deltaNotFound
		}
		*buf = old
		if len(old) == 0 || itemSize(len(key), in.Flags, len(old)) > slabChunkMax {
			return 0, in, in, deltaNonNumeric
		}
		if casv != 0 && casv != in.Version {
			return 0, in, in, deltaCASMismatch
		}
		v, ok := numericValue(old)
		if !ok {
			return 0, in, in, deltaNonNumeric
		}
		switch {
		case incr:
			v += delta
		case delta > v:
			v = 0
		default:
			v -= delta
		}
		nv := appendUint(make([]byte, 0, max(len(old), 20)), v)
		for len(nv) < len(old) {
			nv = append(nv, ' ')
		}
		o := keep(in)
		if ttl != nil {
			o.TTL = *ttl
		}
		ver, err := p.Set(ctx, key, nv, o)
		switch {
		case err == nil:
			after := cache.Info{Version: ver, Flags: in.Flags}
			if o.TTL > 0 {
				after.Expires = time.Now().Add(o.TTL)
			}
			return v, in, after, ""
		case errors.Is(err, cache.ErrExists), errors.Is(err, cache.ErrNotFound):
			continue
		}
		s.failed("incr", err)
		return 0, in, in, deltaNoMemory
	}
}

func (cn *conn) arith(tokens [][]byte, incr bool) {
	cn.setNoreply(tokens)
	key := tokens[1]
	if len(key) > maxKey {
		cn.out(errBadFormat)
		return
	}
	delta, ok := safeStrtoull(tokens[2])
	if !ok {
		cn.out("CLIENT_ERROR invalid numeric delta argument")
		return
	}
	v, fail := cn.s.addDelta(cn.ctx, key, incr, delta, 0, &cn.old)
	st := &cn.s.st
	switch {
	case fail == deltaNotFound && incr:
		st.incrMisses.Add(1)
	case fail == deltaNotFound:
		st.decrMisses.Add(1)
	case fail == "" && incr:
		st.incrHits.Add(1)
	case fail == "":
		st.decrHits.Add(1)
	}
	if fail != "" {
		cn.out(fail)
		return
	}
	var num [20]byte
	cn.out(string(appendUint(num[:0], v)))
}

// delete is memcached's process_delete_command: "delete <key> [0]
// [noreply]".
func (cn *conn) delete(tokens [][]byte) {
	ntokens := len(tokens) + 1
	if ntokens > 3 {
		holdIsZero := string(tokens[2]) == "0"
		noreply := cn.setNoreply(tokens)
		valid := (ntokens == 4 && (holdIsZero || noreply)) || (ntokens == 5 && holdIsZero && noreply)
		if !valid {
			cn.out("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")
			return
		}
	}
	key := tokens[1]
	if len(key) > maxKey {
		cn.out(errBadFormat)
		return
	}
	found, err := cn.s.store().Delete(cn.ctx, key)
	cn.s.failed("delete", err)
	if found {
		cn.s.st.deleteHits.Add(1)
		cn.out("DELETED")
	} else {
		cn.s.st.deleteMisses.Add(1)
		cn.out("NOT_FOUND")
	}
}

func (cn *conn) touch(tokens [][]byte) {
	cn.setNoreply(tokens)
	key := tokens[1]
	if len(key) > maxKey {
		cn.out(errBadFormat)
		return
	}
	exptime, ok := safeStrtol(tokens[2])
	if !ok {
		cn.out("CLIENT_ERROR invalid exptime argument")
		return
	}
	st := &cn.s.st
	st.cmdTouch.Add(1)
	if cn.s.store().Touch(cn.ctx, key, ttlOf(exptime)) != nil {
		st.touchMisses.Add(1)
		cn.out("NOT_FOUND")
		return
	}
	st.touchHits.Add(1)
	cn.out("TOUCHED")
}

// flush is memcached's process_flush_all_command: "flush_all [delay]
// [noreply]"; a later flush_all replaces a delayed one.
func (cn *conn) flush(tokens [][]byte) {
	noreply := cn.setNoreply(tokens)
	cn.s.st.cmdFlush.Add(1)
	var delay int32
	want := 1
	if noreply {
		want = 2
	}
	if len(tokens) != want {
		var ok bool
		if delay, ok = safeStrtol(tokens[1]); !ok {
			cn.out("CLIENT_ERROR invalid exptime argument")
			return
		}
	}
	s := cn.s
	s.mu.Lock()
	if s.flushTimer != nil {
		s.flushTimer.Stop()
		s.flushTimer = nil
	}
	var d time.Duration
	if delay > 0 {
		d = cache.ExpTime(int64(delay))
	}
	if d > 0 {
		s.flushTimer = time.AfterFunc(d, func() { s.failed("flush_all", s.store().Flush(s.ctx)) })
	}
	s.mu.Unlock()
	if d <= 0 {
		s.failed("flush_all", s.store().Flush(cn.ctx))
	}
	cn.out("OK")
}

func (cn *conn) verbosity(tokens [][]byte) {
	cn.setNoreply(tokens)
	level, ok := safeStrtoul(tokens[1])
	if !ok {
		cn.out(errBadFormat)
		return
	}
	cn.s.verbosity.Store(min(level, maxVerbosity))
	cn.out("OK")
}
