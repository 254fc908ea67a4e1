package memcached

import (
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
)

// counters are a server's own statistics, as memcached's: for the
// commands this server ran (the pool's item counts are the pool's, shared
// by every process and server using it).
type counters struct {
	currConns atomic.Int64

	totalConns, cmdGet, cmdSet, cmdFlush, cmdTouch,
	getHits, getMisses, deleteMisses, deleteHits, incrMisses, incrHits,
	decrMisses, decrHits, casMisses, casHits, casBadval, touchHits,
	touchMisses, storeTooLarge, storeNoMemory, bytesRead, bytesWritten,
	rejectedConns, acceptErrors,
	totalItems atomic.Uint64
}

// resettable are the counters stats reset zeroes (all but the current
// connections, as memcached).
func (c *counters) resettable() []*atomic.Uint64 {
	return []*atomic.Uint64{&c.totalConns, &c.cmdGet, &c.cmdSet, &c.cmdFlush, &c.cmdTouch,
		&c.getHits, &c.getMisses, &c.deleteMisses, &c.deleteHits, &c.incrMisses, &c.incrHits,
		&c.decrMisses, &c.decrHits, &c.casMisses, &c.casHits, &c.casBadval, &c.touchHits,
		&c.touchMisses, &c.storeTooLarge, &c.storeNoMemory, &c.bytesRead, &c.bytesWritten, &c.totalItems}
}

// stats is memcached's process_stat for the subcommands that mean
// something here: none (the general statistics), settings, sizes and
// reset. The others (items, slabs, conns, detail, cachedump) are about
// memcached's slab allocator and connection table, which this server
// does not have: ERROR, as memcached answers a subcommand it does not
// know.
func (cn *conn) stats(tokens [][]byte) {
	if len(tokens) == 1 {
		cn.generalStats()
		return
	}
	switch string(tokens[1]) {
	case "reset":
		for _, c := range cn.s.st.resettable() {
			c.Store(0)
		}
		cn.out("RESET")
	case "settings":
		cn.settingsStats()
	case "sizes":
		cn.w.WriteString("STAT sizes_status disabled\r\nEND\r\n")
	default:
		cn.out("ERROR")
	}
}

func (cn *conn) stat(name string, v string) {
	cn.w.WriteString("STAT ")
	cn.w.WriteString(name)
	cn.w.WriteByte(' ')
	cn.w.WriteString(v)
	cn.w.WriteString("\r\n")
}

func (cn *conn) statUint(name string, v uint64) { cn.stat(name, strconv.FormatUint(v, 10)) }

// generalStats writes memcached's fields, in its order, for those this
// server has; docs/cache.md lists the ones left out.
func (cn *conn) generalStats() {
	s, st := cn.s, &cn.s.st
	ps := s.store().Stats()
	now := time.Now()
	s.mu.Lock()
	accepting := !s.closed
	s.mu.Unlock()
	cn.statUint("pid", uint64(os.Getpid()))
	cn.statUint("uptime", uint64(now.Sub(s.start)/time.Second))
	cn.statUint("time", uint64(now.Unix()))
	cn.stat("version", Version)
	cn.statUint("pointer_size", strconv.IntSize)
	cn.statUint("curr_connections", uint64(st.currConns.Load()))
	cn.statUint("total_connections", st.totalConns.Load())
	cn.statUint("rejected_connections", st.rejectedConns.Load())
	cn.statUint("cmd_get", st.cmdGet.Load())
	cn.statUint("cmd_set", st.cmdSet.Load())
	cn.statUint("cmd_flush", st.cmdFlush.Load())
	cn.statUint("cmd_touch", st.cmdTouch.Load())
	// memcached 1.6.18 counts only its debug command me here, which
	// this server does not have.
	cn.statUint("cmd_meta", 0)
	cn.statUint("get_hits", st.getHits.Load())
	cn.statUint("get_misses", st.getMisses.Load())
	cn.statUint("delete_misses", st.deleteMisses.Load())
	cn.statUint("delete_hits", st.deleteHits.Load())
	cn.statUint("incr_misses", st.incrMisses.Load())
	cn.statUint("incr_hits", st.incrHits.Load())
	cn.statUint("decr_misses", st.decrMisses.Load())
	cn.statUint("decr_hits", st.decrHits.Load())
	cn.statUint("cas_misses", st.casMisses.Load())
	cn.statUint("cas_hits", st.casHits.Load())
	cn.statUint("cas_badval", st.casBadval.Load())
	cn.statUint("touch_hits", st.touchHits.Load())
	cn.statUint("touch_misses", st.touchMisses.Load())
	cn.statUint("store_too_large", st.storeTooLarge.Load())
	cn.statUint("store_no_memory", st.storeNoMemory.Load())
	cn.statUint("auth_cmds", 0)
	cn.statUint("auth_errors", 0)
	cn.statUint("bytes_read", st.bytesRead.Load())
	cn.statUint("bytes_written", st.bytesWritten.Load())
	cn.statUint("limit_maxbytes", ps.MaxBytes)
	cn.statUint("accepting_conns", map[bool]uint64{false: 0, true: 1}[accepting])
	cn.statUint("threads", uint64(runtime.GOMAXPROCS(0)))
	cn.statUint("bytes", ps.Bytes)
	cn.statUint("curr_items", ps.Items)
	cn.statUint("total_items", st.totalItems.Load())
	cn.statUint("evictions", ps.Evictions)
	cn.w.WriteString("END\r\n")
}

// settingsStats writes the settings of memcached's that this server has,
// with its values.
func (cn *conn) settingsStats() {
	cn.statUint("maxbytes", cn.s.store().Stats().MaxBytes)
	cn.statUint("verbosity", uint64(cn.s.verbosity.Load()))
	cn.stat("evictions", "on")
	cn.statUint("num_threads", uint64(runtime.GOMAXPROCS(0)))
	cn.stat("cas_enabled", "yes")
	cn.stat("binding_protocol", "ascii")
	cn.statUint("item_size_max", uint64(min(itemSizeMax, cn.s.store().MaxValue())))
	cn.stat("flush_enabled", "yes")
	cn.w.WriteString("END\r\n")
}
