package rediscache

import (
	"strconv"
	"strings"
)

// Which keys a command writes, so that a write through this client makes
// the near cache forget them before it returns (read-your-writes does not
// wait for the invalidation push, which travels on another connection and
// may arrive later).
//
// The server says: its COMMAND reply gives every command's flags and key
// specifications (Redis 7), or first/last/step key positions (Redis 6),
// and the tracker loads it each time it connects. A command the table
// does not know (a module's, a renamed one), or whose written keys cannot
// be told from its arguments, flushes the whole near cache for the server
// instead: slower, never wrong.

// cmdTable is the server's command table by lower-case name.
type cmdTable map[string]*cmdInfo

type cmdInfo struct {
	write, readonly, movable bool
	first, last, step        int
	specs                    []keySpec // nil on Redis 6
	subs                     cmdTable  // container commands (xgroup|create ...)
}

// keySpec is one Redis 7 key specification: where its keys begin and how
// they continue.
type keySpec struct {
	writes bool // RW, OW or RM (or no access flag at all)
	// begin_search
	bsKind    byte // 'i' index, 'k' keyword, '?' unknown
	bsIndex   int
	bsKeyword string
	bsFrom    int
	// find_keys
	fkKind                    byte // 'r' range, 'n' keynum, '?' unknown
	lastKey, keyStep, limit   int
	keyNumIdx, firstKey, step int
}

// parseCommandTable reads a COMMAND reply.
func parseCommandTable(v value) cmdTable {
	t := make(cmdTable, len(v.items))
	for _, c := range v.items {
		name, ci := parseCommandInfo(c)
		if name != "" {
			t[name] = ci
		}
	}
	return t
}

func parseCommandInfo(c value) (string, *cmdInfo) {
	if len(c.items) < 6 {
		return "", nil
	}
	name := strings.ToLower(c.items[0].str)
	ci := &cmdInfo{first: int(c.items[3].num), last: int(c.items[4].num), step: int(c.items[5].num)}
	if ci.step < 1 {
		ci.step = 1
	}
	for _, f := range c.items[2].items {
		switch f.str {
		case "write":
			ci.write = true
		case "readonly":
			ci.readonly = true
		case "movablekeys":
			ci.movable = true
		}
	}
	if len(c.items) >= 9 {
		ci.specs = []keySpec{}
		for _, s := range c.items[8].items {
			ci.specs = append(ci.specs, parseKeySpec(s))
		}
	}
	if len(c.items) >= 10 && len(c.items[9].items) > 0 {
		ci.subs = cmdTable{}
		for _, s := range c.items[9].items {
			sub, si := parseCommandInfo(s)
			if _, rest, ok := strings.Cut(sub, "|"); ok {
				ci.subs[rest] = si
			}
		}
	}
	return name, ci
}

// mapGet finds a key in a RESP3 map (or a RESP2 flat array of pairs).
func mapGet(m value, key string) (value, bool) {
	for i := 0; i+1 < len(m.items); i += 2 {
		if m.items[i].str == key {
			return m.items[i+1], true
		}
	}
	return value{}, false
}

func mapInt(m value, key string) int {
	v, _ := mapGet(m, key)
	if v.kind == ':' {
		return int(v.num)
	}
	n, _ := strconv.Atoi(v.str)
	return n
}

func parseKeySpec(s value) keySpec {
	ks := keySpec{bsKind: '?', fkKind: '?'}
	access := false
	if f, ok := mapGet(s, "flags"); ok {
		for _, fl := range f.items {
			switch fl.str {
			case "RW", "OW", "RM":
				ks.writes, access = true, true
			case "RO":
				access = true
			}
		}
	}
	if !access {
		ks.writes = true
	}
	if bs, ok := mapGet(s, "begin_search"); ok {
		typ, _ := mapGet(bs, "type")
		spec, _ := mapGet(bs, "spec")
		switch typ.str {
		case "index":
			if i := mapInt(spec, "index"); i >= 1 {
				ks.bsKind, ks.bsIndex = 'i', i
			}
		case "keyword":
			kw, _ := mapGet(spec, "keyword")
			ks.bsKind, ks.bsKeyword, ks.bsFrom = 'k', kw.str, mapInt(spec, "startfrom")
		}
	}
	if fk, ok := mapGet(s, "find_keys"); ok {
		typ, _ := mapGet(fk, "type")
		spec, _ := mapGet(fk, "spec")
		switch typ.str {
		case "range":
			ks.fkKind = 'r'
			ks.lastKey, ks.keyStep, ks.limit = mapInt(spec, "lastkey"), mapInt(spec, "keystep"), mapInt(spec, "limit")
		case "keynum":
			ks.keyNumIdx, ks.firstKey, ks.step = mapInt(spec, "keynumidx"), mapInt(spec, "firstkey"), mapInt(spec, "keystep")
			if ks.keyNumIdx >= 0 && ks.firstKey >= 0 {
				ks.fkKind = 'n'
			}
		}
	}
	return ks
}

// argString is an argument as Redis receives it (go-redis's own
// formatting of the common types).
func argString(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}

// writtenKeys says which keys a command may write. all: the command may
// write keys its arguments do not name (or the table cannot tell), so the
// whole near cache must go.
func (t cmdTable) writtenKeys(args []any) (keys []string, all bool) {
	if len(args) == 0 {
		return nil, false
	}
	name, ok := argString(args[0])
	if !ok {
		return nil, true
	}
	name = strings.ToLower(name)
	switch name {
	case "multi", "exec", "discard", "watch", "unwatch", "select", "ping", "echo", "hello", "auth", "quit", "reset":
		return nil, false // no keys; the queued commands of a transaction are looked at one by one
	}
	if t == nil {
		return nil, true // not loaded yet
	}
	ci, ok := t[name]
	if !ok {
		return nil, true
	}
	if ci.subs != nil && len(args) > 1 {
		sub, _ := argString(args[1])
		si, ok := ci.subs[strings.ToLower(sub)]
		if !ok {
			// The table is the server's: it refuses a subcommand it does
			// not list (go-redis's CLIENT SETINFO on Redis 7.0, say).
			return nil, false
		}
		ci = si
	}
	if ci.readonly && !ci.specWrites() {
		// (PFCOUNT is read-only but its key spec is RW: it rewrites the
		// HyperLogLog's cached cardinality.)
		return nil, false
	}
	if name == "sort" {
		return sortStore(args)
	}
	if ci.specs == nil {
		return ci.legacyKeys(name, args)
	}
	if len(ci.specs) == 0 {
		// No keys: a write of that kind touches the whole keyspace
		// (FLUSHDB, FLUSHALL, SWAPDB, FUNCTION RESTORE ...).
		return nil, ci.write
	}
	for _, s := range ci.specs {
		if !s.writes {
			continue
		}
		ks, ok := s.keys(args)
		if !ok {
			return nil, true
		}
		keys = append(keys, ks...)
	}
	return keys, false
}

func (ci *cmdInfo) specWrites() bool {
	for _, s := range ci.specs {
		if s.writes {
			return true
		}
	}
	return false
}

// sortStore finds SORT's STORE destination, whose key spec is "unknown":
// SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC]
// [ALPHA] [STORE destination]. Without STORE it writes nothing.
func sortStore(args []any) ([]string, bool) {
	for i := 2; i < len(args); i++ {
		s, ok := argString(args[i])
		if !ok {
			return nil, true
		}
		switch strings.ToLower(s) {
		case "by", "get":
			i++
		case "limit":
			i += 2
		case "store":
			if i+1 >= len(args) {
				return nil, false // a syntax error: nothing written
			}
			k, ok := argString(args[i+1])
			return []string{k}, !ok
		}
	}
	return nil, false
}

// legacyKeys uses Redis 6's first/last/step.
func (ci *cmdInfo) legacyKeys(name string, args []any) ([]string, bool) {
	if ci.movable {
		if name == "eval" || name == "evalsha" || name == "fcall" {
			return numKeys(args, 2, 3, 1)
		}
		return nil, true
	}
	if ci.first <= 0 {
		return nil, ci.write
	}
	last := ci.last
	if last < 0 {
		last = len(args) + last
	}
	var keys []string
	for i := ci.first; i <= last && i < len(args); i += max(ci.step, 1) {
		k, ok := argString(args[i])
		if !ok {
			return nil, true
		}
		keys = append(keys, k)
	}
	return keys, false
}

// numKeys reads a count at args[at] and that many keys from args[from] on,
// every step.
func numKeys(args []any, at, from, step int) ([]string, bool) {
	if at < 1 || from < 1 {
		return nil, true
	}
	if at >= len(args) {
		return nil, false // an arity error from Redis; nothing written
	}
	s, ok := argString(args[at])
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 {
		return nil, false // Redis refuses it
	}
	var keys []string
	for i := 0; i < n && from+i*step < len(args); i++ {
		k, ok := argString(args[from+i*step])
		if !ok {
			return nil, true
		}
		keys = append(keys, k)
	}
	return keys, false
}

// keys applies a key spec to a command's arguments; false: it cannot tell.
func (s keySpec) keys(args []any) ([]string, bool) {
	begin := -1
	switch s.bsKind {
	case 'i':
		begin = s.bsIndex
	case 'k':
		if s.bsFrom >= 0 {
			for i := s.bsFrom; i < len(args); i++ {
				if a, _ := argString(args[i]); strings.EqualFold(a, s.bsKeyword) {
					begin = i + 1
					break
				}
			}
		} else {
			for i := len(args) + s.bsFrom; i > 0; i-- {
				if a, _ := argString(args[i]); strings.EqualFold(a, s.bsKeyword) {
					begin = i + 1
					break
				}
			}
		}
		if begin < 0 {
			return nil, true // the keyword is absent: no such keys
		}
	default:
		return nil, false
	}
	if begin >= len(args) {
		return nil, true
	}
	switch s.fkKind {
	case 'r':
		last := begin + s.lastKey
		if s.lastKey < 0 {
			last = len(args) + s.lastKey
			if s.limit > 1 {
				last = begin + (last-begin+1)/s.limit - 1
			}
		}
		var keys []string
		for i := begin; i <= last && i < len(args); i += max(s.keyStep, 1) {
			k, ok := argString(args[i])
			if !ok {
				return nil, false
			}
			keys = append(keys, k)
		}
		return keys, true
	case 'n':
		keys, all := numKeys(args, begin+s.keyNumIdx, begin+s.firstKey, max(s.step, 1))
		return keys, !all
	}
	return nil, false
}
