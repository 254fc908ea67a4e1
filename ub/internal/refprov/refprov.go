// Package refprov is a reference ub provider, written from the "Writing a
// provider" section of docs/ub.md and the ub package documentation alone,
// to show that they are enough to pass ub/ubtest. It uses nothing of the
// other providers: only the exported ub API and the standard library.
//
// It reaches processes on one host (one network namespace). Every context
// listens on an abstract unix socket named by its EID, and every verb is a
// request to the owner of the memory or jetty it touches, answered in
// order on one connection per peer; the owner checks token, access and
// bounds. Requests run when they are posted: PostSend returns when their
// completions are queued. It is simple rather than fast. Its atomics are
// CPU atomics on the owner's memory (shm.WordIn, the one thing it uses
// beyond the ub API and the standard library: ubkit keeps unsafe in shm),
// so they are atomic with respect to the owner's own atomics on
// Segment.Bytes too.
//
// It registers as "ref" only in programs that import it: ubkit's own
// tests.
package refprov

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// Name is the provider's registered name.
const Name = "ref"

func init() { ub.Register(Name, provider{}) }

type provider struct{}

var (
	errClosed = fmt.Errorf("refprov: %w", ub.ErrClosed)
	errCQFull = fmt.Errorf("refprov: %w", ub.ErrCQFull)
)

// address is where the context with eid listens: an abstract unix socket,
// which leaves no file behind, even when its process is killed.
func address(eid ub.EID) string { return "@ubkit-ref-" + eid.String() }

// Open makes a context listening for its peers' requests. It takes no
// options.
func (provider) Open(_ context.Context, _ ub.Config) (ub.Context, error) {
	c := &Context{segs: map[uint32]*segment{}, jetties: map[uint32]*jetty{},
		objects: map[io.Closer]uint64{}, served: map[net.Conn]struct{}{}, clients: map[ub.EID]*client{}}
	if _, err := rand.Read(c.eid[:]); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", address(c.eid))
	if err != nil {
		return nil, fmt.Errorf("refprov: listen: %w", err)
	}
	c.l = l
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

// Context is an endpoint of the reference provider.
type Context struct {
	eid ub.EID
	l   net.Listener
	wg  sync.WaitGroup // the accept loop and the connections it serves

	mu      sync.Mutex
	closed  bool
	seq     uint64 // orders objects (for Close) and names segments and jetties
	segs    map[uint32]*segment
	jetties map[uint32]*jetty
	objects map[io.Closer]uint64 // open objects, by when they were made
	served  map[net.Conn]struct{}
	clients map[ub.EID]*client // connections to peers
}

func (c *Context) EID() ub.EID      { return c.eid }
func (c *Context) Provider() string { return Name }

// track records o for Close; place, if given, puts it where requests find
// it under a new id.
func (c *Context) track(o io.Closer, place func(id uint32)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	c.seq++
	c.objects[o] = c.seq
	if place != nil {
		place(uint32(c.seq))
	}
	return nil
}

func (c *Context) untrack(o io.Closer) {
	c.mu.Lock()
	delete(c.objects, o)
	c.mu.Unlock()
}

func (c *Context) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close stops serving peers, ends the requests in flight to them and
// closes every object, newest first.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	objs := make([]io.Closer, 0, len(c.objects))
	for o := range c.objects {
		objs = append(objs, o)
	}
	slices.SortFunc(objs, func(a, b io.Closer) int { return cmp.Compare(c.objects[b], c.objects[a]) })
	c.objects = map[io.Closer]uint64{}
	for nc := range c.served {
		nc.Close()
	}
	for _, cl := range c.clients {
		cl.nc.Close()
	}
	c.clients = map[ub.EID]*client{}
	c.mu.Unlock()
	err := c.l.Close()
	c.wg.Wait()
	errs := []error{err}
	for _, o := range objs {
		errs = append(errs, o.Close())
	}
	return errors.Join(errs...)
}

// segment is registered memory. mu is held by every access through the
// bus, which makes the bus's atomics atomic with respect to each other.
type segment struct {
	c      *Context
	id     uint32
	access ub.Access
	token  ub.Token
	mu     sync.Mutex
	bytes  []byte
	closed bool
}

func (c *Context) AllocSegment(size int, cfg ub.SegmentConfig) (ub.Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("refprov: %w: segment size %d must be positive", ub.ErrInvalidArgument, size)
	}
	s := &segment{c: c, access: cfg.Access.Normalize(), token: cfg.Token, bytes: make([]byte, size)}
	if err := c.track(s, func(id uint32) { s.id, c.segs[id] = id, s }); err != nil {
		return nil, err
	}
	return s, nil
}

// RegisterSegment registers the caller's memory: every access goes
// through this process, so any memory will do.
func (c *Context) RegisterSegment(mem []byte, cfg ub.SegmentConfig) (ub.Segment, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("refprov: %w: no memory to register", ub.ErrInvalidArgument)
	}
	s := &segment{c: c, access: cfg.Access.Normalize(), token: cfg.Token, bytes: mem[:len(mem):len(mem)]}
	if err := c.track(s, func(id uint32) { s.id, c.segs[id] = id, s }); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *segment) Bytes() []byte { return s.bytes }

func (s *segment) Desc() ub.SegmentDesc {
	return ub.SegmentDesc{Provider: Name, EID: s.c.eid, Name: "s" + strconv.FormatUint(uint64(s.id), 10), Size: len(s.bytes)}
}

func (s *segment) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.c.mu.Lock()
	if s.c.segs[s.id] == s {
		delete(s.c.segs, s.id)
	}
	delete(s.c.objects, s)
	s.c.mu.Unlock()
	return nil
}

// inRange reports whether [off, off+n) lies in a buffer of size bytes.
func inRange(off, n, size int) bool { return off >= 0 && n >= 0 && n <= size && off <= size-n }

// local copies a local buffer out (into is nil) or data into it,
// reporting StatusLocalLength if it is not a range of an open segment of
// c.
func (c *Context) local(l ub.Local, into []byte) ([]byte, ub.Status) {
	s, ok := l.Seg.(*segment)
	if !ok || s.c != c {
		return nil, ub.StatusLocalLength
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !inRange(l.Offset, l.Len, len(s.bytes)) {
		return nil, ub.StatusLocalLength
	}
	if into != nil {
		copy(s.bytes[l.Offset:l.Offset+l.Len], into)
		return nil, ub.StatusSuccess
	}
	return slices.Clone(s.bytes[l.Offset : l.Offset+l.Len]), ub.StatusSuccess
}

// parseID reads the id from a descriptor's name: kind, then a number.
func parseID(name string, kind byte) (uint32, error) {
	if name == "" || name[0] != kind {
		return 0, fmt.Errorf("refprov: %w: %q is not a name this provider gives", ub.ErrBadDescriptor, name)
	}
	id, err := strconv.ParseUint(name[1:], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("refprov: %w: %q: %w", ub.ErrBadDescriptor, name, err)
	}
	return uint32(id), nil
}

// remoteSegment is a peer's segment: where its owner listens, its id and
// our token. It holds nothing.
type remoteSegment struct {
	desc  ub.SegmentDesc
	id    uint32
	token ub.Token
}

func (c *Context) ImportSegment(desc ub.SegmentDesc, token ub.Token) (ub.RemoteSegment, error) {
	if c.isClosed() {
		return nil, errClosed
	}
	if desc.Provider != Name {
		return nil, fmt.Errorf("refprov: %w: cannot import a %q segment", ub.ErrBadDescriptor, desc.Provider)
	}
	id, err := parseID(desc.Name, 's')
	if err != nil {
		return nil, err
	}
	return &remoteSegment{desc: desc, id: id, token: token}, nil
}

func (r *remoteSegment) Desc() ub.SegmentDesc { return r.desc }
func (r *remoteSegment) Close() error         { return nil }

// target is a peer's jetty, like remoteSegment.
type target struct {
	desc  ub.JettyDesc
	id    uint32
	token ub.Token
}

func (c *Context) ImportJetty(desc ub.JettyDesc, token ub.Token) (ub.Target, error) {
	if c.isClosed() {
		return nil, errClosed
	}
	if desc.Provider != Name {
		return nil, fmt.Errorf("refprov: %w: cannot import a %q jetty", ub.ErrBadDescriptor, desc.Provider)
	}
	id, err := parseID(desc.Name, 'j')
	if err != nil {
		return nil, err
	}
	return &target{desc: desc, id: id, token: token}, nil
}

func (t *target) Desc() ub.JettyDesc { return t.desc }
func (t *target) Close() error       { return nil }

// request is one verb, sent to the owner of what it touches.
type request struct {
	Op     ub.Opcode
	Object uint32 // the segment, or the jetty of a send
	Token  ub.Token
	Offset int
	Len    int // of a Read
	Data   []byte
	// A WriteImm's notification goes to Jetty with JettyToken.
	Jetty      uint32
	JettyToken ub.Token
	Imm        uint64
	HasImm     bool
	Unreliable bool
	Compare    uint64
	Swap       uint64
	Add        uint64
}

type response struct {
	Status ub.Status
	Value  uint64
	Data   []byte
}

// client is a connection to a peer; a call holds mu for its round trip, so
// requests to one peer are answered in the order they were sent.
type client struct {
	nc  net.Conn
	mu  sync.Mutex
	enc *gob.Encoder
	dec *gob.Decoder
}

// call sends req to the context with eid and returns the answer. A peer
// that cannot be reached, or whose connection breaks, is dead; once this
// context is closed, the request is flushed.
func (c *Context) call(eid ub.EID, req *request) response {
	cl, err := c.client(eid)
	if err == nil {
		cl.mu.Lock()
		var resp response
		if err = cl.enc.Encode(req); err == nil {
			err = cl.dec.Decode(&resp)
		}
		cl.mu.Unlock()
		if err == nil {
			return resp
		}
		cl.nc.Close()
		c.mu.Lock()
		if c.clients[eid] == cl {
			delete(c.clients, eid)
		}
		c.mu.Unlock()
	}
	if c.isClosed() {
		return response{Status: ub.StatusFlushed}
	}
	return response{Status: ub.StatusPeerDead}
}

// client returns the connection to eid, dialling it if there is none.
func (c *Context) client(eid ub.EID) (*client, error) {
	c.mu.Lock()
	cl := c.clients[eid]
	c.mu.Unlock()
	if cl != nil {
		return cl, nil
	}
	nc, err := net.DialTimeout("unix", address(eid), 2*time.Second)
	if err != nil {
		return nil, err
	}
	cl = &client{nc: nc, enc: gob.NewEncoder(nc), dec: gob.NewDecoder(nc)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		nc.Close()
		return nil, errClosed
	}
	if other := c.clients[eid]; other != nil {
		// Another call connected meanwhile: one connection per peer
		// keeps requests in order.
		nc.Close()
		return other, nil
	}
	c.clients[eid] = cl
	return cl, nil
}

func (c *Context) accept() {
	defer c.wg.Done()
	for {
		nc, err := c.l.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			nc.Close()
			return
		}
		c.served[nc] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.wg.Done()
			c.serve(nc)
			c.mu.Lock()
			delete(c.served, nc)
			c.mu.Unlock()
			nc.Close()
		}()
	}
}

// serve answers a peer's requests in order until the connection ends or
// carries something that is not a request.
func (c *Context) serve(nc net.Conn) {
	dec, enc := gob.NewDecoder(nc), gob.NewEncoder(nc)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return
		}
		if err := enc.Encode(c.execute(&req)); err != nil {
			return
		}
	}
}

// execute runs a peer's request against this context's objects, with the
// checks the owner of memory makes.
func (c *Context) execute(req *request) response {
	switch req.Op {
	case ub.OpSend, ub.OpSendImm:
		return response{Status: c.deliver(req.Object, req.Token, req.Data, ub.OpRecv, req.Imm, req.HasImm, req.Unreliable)}
	case ub.OpWrite, ub.OpWriteImm, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
	default:
		return response{Status: ub.StatusUnsupported}
	}
	c.mu.Lock()
	s := c.segs[req.Object]
	c.mu.Unlock()
	if s == nil {
		return response{Status: ub.StatusNoPermission} // deregistered, or never was
	}
	if req.Token != s.token {
		return response{Status: ub.StatusBadToken}
	}
	need, n := ub.AccessAtomic, 8
	switch req.Op {
	case ub.OpWrite, ub.OpWriteImm:
		need, n = ub.AccessWrite, len(req.Data)
	case ub.OpRead:
		need, n = ub.AccessRead, req.Len
	}
	if s.access&need != need {
		return response{Status: ub.StatusNoPermission}
	}
	if !inRange(req.Offset, n, len(s.bytes)) {
		return response{Status: ub.StatusOutOfBounds}
	}
	if need == ub.AccessAtomic && req.Offset%8 != 0 {
		return response{Status: ub.StatusMisaligned}
	}
	var word *atomic.Uint64
	if need == ub.AccessAtomic {
		// In range (checked): an error is registered memory whose word
		// at an aligned offset is not 8-byte aligned in memory.
		w, err := shm.WordIn(s.bytes, req.Offset)
		if err != nil {
			return response{Status: ub.StatusMisaligned}
		}
		word = w
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return response{Status: ub.StatusNoPermission}
	}
	var resp response
	mem := s.bytes[req.Offset : req.Offset+n]
	switch req.Op {
	case ub.OpWrite, ub.OpWriteImm:
		copy(mem, req.Data)
	case ub.OpRead:
		resp.Data = slices.Clone(mem)
	case ub.OpCAS:
		// CPU atomics, so that they are atomic with respect to the
		// owner's own on Bytes too, not only to each other.
		for {
			resp.Value = word.Load()
			if resp.Value != req.Compare || word.CompareAndSwap(resp.Value, req.Swap) {
				break
			}
		}
	case ub.OpFetchAdd:
		resp.Value = word.Add(req.Add) - req.Add
	}
	s.mu.Unlock()
	if req.Op == ub.OpWriteImm {
		resp.Status = c.deliver(req.Jetty, req.JettyToken, nil, ub.OpWriteImm, req.Imm, true, false)
	}
	return resp
}
