package rediscache

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A RESP3 reader for the tracking connection: it needs replies to HELLO,
// CLIENT, COMMAND and PING, and "invalidate" pushes. Each top-level value
// has a budget of items and bytes, so a hostile or broken server cannot
// make it allocate without limit, and nesting (attributes included) is
// bounded, so it cannot exhaust the stack.

const (
	maxBulk  = 64 << 20
	maxItems = 1 << 20 // in one value, nested ones included
	maxBytes = 64 << 20
	maxDepth = 8
)

// budget is what is left for one top-level value.
type budget struct{ items, bytes int }

var errTooBig = fmt.Errorf("%w: a value beyond %d items or %d bytes", errProtocol, maxItems, maxBytes)

func (b *budget) take(items, bytes int) error {
	b.items -= items
	b.bytes -= bytes
	if b.items < 0 || b.bytes < 0 {
		return errTooBig
	}
	return nil
}

// value is a parsed RESP3 value.
type value struct {
	kind  byte // '+', '-', ':', '$', '*', '%', '~', '>', '_', '#', ',', '(', '!', '=', '|'
	str   string
	num   int64
	items []value // aggregates (maps: key, value, key, value ...)
}

func (v value) isNull() bool {
	return v.kind == '_' || (v.kind == '$' && v.num < 0) || (v.kind == '*' && v.num < 0)
}

func (v value) err() error {
	if v.kind == '-' || v.kind == '!' {
		return errors.New("redis: " + v.str)
	}
	return nil
}

var errProtocol = errors.New("rediscache: malformed reply from the server")

func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return "", fmt.Errorf("%w: a line longer than %d bytes", errProtocol, r.Size())
	}
	if err != nil {
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("%w: a line without CRLF", errProtocol)
	}
	return string(line[:len(line)-2]), nil
}

// readValue reads one top-level value.
func readValue(r *bufio.Reader, depth int) (value, error) {
	b := budget{items: maxItems, bytes: maxBytes}
	return readNested(r, depth, &b)
}

func readNested(r *bufio.Reader, depth int, b *budget) (value, error) {
	if depth > maxDepth {
		return value{}, fmt.Errorf("%w: nested deeper than %d", errProtocol, maxDepth)
	}
	line, err := readLine(r)
	if err != nil {
		return value{}, err
	}
	if err := b.take(1, len(line)+64); err != nil { // a value's own size, roughly
		return value{}, err
	}
	if line == "" {
		return value{}, fmt.Errorf("%w: an empty line", errProtocol)
	}
	v := value{kind: line[0]}
	rest := line[1:]
	switch v.kind {
	case '+', '-', ',', '(', '#':
		v.str = rest
	case ':':
		if v.num, err = strconv.ParseInt(rest, 10, 64); err != nil {
			return value{}, fmt.Errorf("%w: integer %q", errProtocol, rest)
		}
	case '_':
	case '$', '!', '=':
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil || n < -1 || n > maxBulk {
			return value{}, fmt.Errorf("%w: bulk length %q", errProtocol, rest)
		}
		v.num = n
		if n < 0 {
			return v, nil
		}
		if err := b.take(0, int(n)); err != nil {
			return value{}, err
		}
		buf := make([]byte, n+2)
		if _, err := readFull(r, buf); err != nil {
			return value{}, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return value{}, fmt.Errorf("%w: bulk string without CRLF", errProtocol)
		}
		v.str = string(buf[:n])
	case '*', '~', '>', '%', '|':
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil || n < -1 || n > maxItems {
			return value{}, fmt.Errorf("%w: aggregate length %q", errProtocol, rest)
		}
		v.num = n
		if v.kind == '%' || v.kind == '|' {
			n *= 2
		}
		if err := b.take(int(max(n, 0)), 0); err != nil {
			return value{}, err
		}
		for range max(n, 0) {
			item, err := readNested(r, depth+1, b)
			if err != nil {
				return value{}, err
			}
			v.items = append(v.items, item)
		}
		if v.kind == '|' {
			// Attributes come before the value they describe; a run of
			// them counts against the budget, not the stack.
			return readNested(r, depth+1, b)
		}
	default:
		return value{}, fmt.Errorf("%w: type byte %q", errProtocol, v.kind)
	}
	return v, nil
}

func readFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeCommand writes a command as a RESP array of bulk strings.
func writeCommand(w *bufio.Writer, args ...string) error {
	bufferCommand(w, args)
	return w.Flush()
}

// writeCommands writes commands whose words contain no spaces (split at
// them) and flushes once.
func writeCommands(w *bufio.Writer, cmds ...string) error {
	for _, c := range cmds {
		bufferCommand(w, strings.Fields(c))
	}
	return w.Flush()
}

func bufferCommand(w *bufio.Writer, args []string) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(a), a)
	}
}
