package shmprov

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

// jettyRings are the two shared rings of a jetty: posted receives (pushed by
// the owner, popped by senders) and receive completions (pushed by senders,
// popped by the owner's RecvCQ).
type jettyRings struct {
	seg    *shm.Segment
	recvs  *shm.MPMC
	compls *shm.MPMC
	state  *atomic.Uint32
	token  ub.Token
	mode   ub.Mode
	maxMsg int
}

func openJettyRings(s *shm.Segment) (*jettyRings, error) {
	d := s.Data()
	if len(d) < jettyHeader {
		return nil, errors.New("too small for a jetty")
	}
	magic, _ := s.Uint64At(0)
	if magic.Load() != jettyMagic {
		return nil, errors.New("not a jetty (bad magic)")
	}
	depth := int(binary.LittleEndian.Uint32(d[jettyOffDepth:]))
	maxMsg := int(binary.LittleEndian.Uint32(d[jettyOffMaxMsg:]))
	mode := ub.Mode(binary.LittleEndian.Uint32(d[jettyOffMode:]))
	if depth < 2 || depth > 1<<16 || depth&(depth-1) != 0 || maxMsg < 1 || mode > ub.Unreliable {
		return nil, fmt.Errorf("jetty header: depth %d, max message %d, mode %d", depth, maxMsg, mode)
	}
	recvOff, complOff, _ := jettyLayout(depth)
	recvs, err := shm.OpenMPMC(s, recvOff, shm.Wait{})
	if err != nil {
		return nil, err
	}
	compls, err := shm.OpenMPMC(s, complOff, shm.Wait{})
	if err != nil {
		recvs.Close()
		return nil, err
	}
	state, _ := s.Uint32At(jettyOffState)
	return &jettyRings{seg: s, recvs: recvs, compls: compls, state: state,
		token: ub.Token(binary.LittleEndian.Uint32(d[jettyOffToken:])), mode: mode, maxMsg: maxMsg}, nil
}

type jetty struct {
	c      *Context
	name   string
	rings  *jettyRings
	cfg    ub.JettyConfig
	send   *cq
	recv   *cq
	mu     sync.Mutex
	bind   verbs.Binding[*target]
	closed bool
	slot   []byte
}

// NewJetty makes a jetty whose receive queue peers reach by its descriptor
// and token.
func (c *Context) NewJetty(cfg ub.JettyConfig) (ub.Jetty, error) {
	send, ok1 := cfg.SendCQ.(*cq)
	recv, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("shmprov: %w: a jetty needs SendCQ and RecvCQ made by this provider", ub.ErrForeignObject)
	}
	if send.c != c || recv.c != c {
		// Its waits hold their own context's lock, not this one's: a
		// Close here could unmap a ring under them.
		return nil, fmt.Errorf("shmprov: %w: a jetty's SendCQ and RecvCQ must come from its own context", ub.ErrForeignObject)
	}
	if cfg.Mode > ub.Unreliable {
		return nil, fmt.Errorf("shmprov: %w: unknown mode %v", ub.ErrInvalidArgument, cfg.Mode)
	}
	depth := cfg.RecvDepth
	if depth <= 0 {
		depth = defaultRecvDepth
	}
	if depth > 1<<16 {
		return nil, fmt.Errorf("shmprov: %w: receive depth %d out of range [1, 65536]", ub.ErrInvalidArgument, cfg.RecvDepth)
	}
	depth = max(2, 1<<bits.Len(uint(depth-1)))
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = defaultMaxMsg
	}
	cfg.RecvDepth = depth
	name := c.name("j")
	recvOff, complOff, size := jettyLayout(depth)
	s, err := shm.CreateSegment(name, size, nil)
	if err != nil {
		return nil, fmt.Errorf("shmprov: new jetty: %w", fdlimit.Hint(err))
	}
	d := s.Data()
	binary.LittleEndian.PutUint32(d[jettyOffToken:], uint32(cfg.Token))
	binary.LittleEndian.PutUint32(d[jettyOffMode:], uint32(cfg.Mode))
	binary.LittleEndian.PutUint32(d[jettyOffMaxMsg:], uint32(cfg.MaxMessage))
	binary.LittleEndian.PutUint32(d[jettyOffDepth:], uint32(depth))
	if _, err := shm.CreateMPMC(s, recvOff, depth, recvSlotSize, shm.Wait{}); err != nil {
		s.Close()
		return nil, err
	}
	// Twice the depth: every completion consumed a posted receive, so at
	// most depth are in flight, plus slack for a receiver that reposts
	// before it polls. A receiver that never polls its RecvCQ eventually
	// makes senders see StatusReceiverNotReady.
	if _, err := shm.CreateMPMC(s, complOff, 2*depth, complSlotSize, shm.Wait{}); err != nil {
		s.Close()
		return nil, err
	}
	state, _ := s.Uint32At(jettyOffState)
	state.Store(stateLive)
	magic, _ := s.Uint64At(0)
	magic.Store(jettyMagic)
	rings, err := openJettyRings(s)
	if err != nil {
		s.Close()
		return nil, err
	}
	// The receive CQ sleeps in Go's netpoller, rung by senders' pushes;
	// without a bell (no FIFO can be made) it sleeps on the ring's futex.
	rings.compls.EnableBell()
	j := &jetty{c: c, name: name, rings: rings, cfg: cfg, send: send, recv: recv, slot: make([]byte, recvSlotSize), bind: verbs.Binding[*target]{Mode: cfg.Mode}}
	recv.attach(rings.compls)
	if err := c.track(j); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

func (j *jetty) Desc() ub.JettyDesc { return ub.JettyDesc{Provider: Name, EID: j.c.eid, Name: j.name} }

func (j *jetty) Bind(t ub.Target) error {
	tg, ok := t.(*target)
	if !ok {
		return fmt.Errorf("shmprov: %w: Bind needs a target imported by this provider", ub.ErrForeignObject)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.bind.Bind("shmprov", tg)
}

// PostRecv posts receive buffers into the jetty's shared receive ring.
func (j *jetty) PostRecv(wrs []ub.RecvWR) (int, error) {
	j.c.ops.RLock()
	defer j.c.ops.RUnlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, errClosed
	}
	for i, wr := range wrs {
		s, ok := wr.Buf.Seg.(*segment)
		if !ok || s.c != j.c {
			return i, fmt.Errorf("shmprov: %w: a receive buffer must be a segment of the jetty's context", ub.ErrForeignObject)
		}
		if s.closed {
			return i, fmt.Errorf("shmprov: receive buffer: %w", ub.ErrClosed)
		}
		if s.registered {
			// A sender finds a receive's memory by the segment's name,
			// and a registration's name is not where its memory is.
			return i, fmt.Errorf("shmprov: %w: a receive buffer in a registered segment (RegisterSegment) is not supported by shm: post receives in an allocated segment", ub.ErrInvalidArgument)
		}
		if !verbs.InRange(wr.Buf.Offset, wr.Buf.Len, len(s.bytes)) || wr.Buf.Len > 1<<31 {
			return i, fmt.Errorf("shmprov: %w: receive buffer [%d, +%d) outside its %d-byte segment", ub.ErrInvalidArgument, wr.Buf.Offset, wr.Buf.Len, len(s.bytes))
		}
		postedRecv{name: s.nameBytes, off: uint64(segHeader + wr.Buf.Offset), len: uint32(wr.Buf.Len), userCtx: wr.UserCtx}.encode(j.slot)
		if err := j.rings.recvs.TryPush(j.slot); err != nil {
			if err == shm.ErrRingFull {
				return i, fmt.Errorf("shmprov: %w (depth %d)", ub.ErrRecvQueueFull, j.cfg.RecvDepth)
			}
			return i, err
		}
	}
	return len(wrs), nil
}

// PostSend runs each work request and queues its completion.
func (j *jetty) PostSend(wrs []ub.WR) (int, error) {
	j.c.ops.RLock()
	defer j.c.ops.RUnlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, errClosed
	}
	for i := range wrs {
		if !j.send.local.Reserve(1) {
			if j.send.local.Closed() {
				return i, errClosed
			}
			return i, errCQFull
		}
		c := j.run(&wrs[i])
		c.Op, c.UserCtx = wrs[i].Op, wrs[i].UserCtx
		if !j.send.local.Push(c, true) {
			return i, errClosed
		}
	}
	return len(wrs), nil
}

func (j *jetty) local(l ub.Local) ([]byte, ub.Status) {
	s, ok := l.Seg.(*segment)
	if !ok || s.c != j.c || s.closed {
		return nil, ub.StatusLocalLength
	}
	if !verbs.InRange(l.Offset, l.Len, len(s.bytes)) {
		return nil, ub.StatusLocalLength
	}
	return s.bytes[l.Offset : l.Offset+l.Len], ub.StatusSuccess
}

func (j *jetty) run(wr *ub.WR) ub.Completion {
	switch wr.Op {
	case ub.OpWrite, ub.OpWriteImm, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
		if j.cfg.Mode == ub.Unreliable {
			return ub.Completion{Status: ub.StatusUnsupported}
		}
		return j.oneSided(wr)
	case ub.OpSend, ub.OpSendImm:
		buf, st := j.local(wr.Local)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		t, st := j.bind.Target(wr.Target)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		if len(buf) > j.cfg.MaxMessage || len(buf) > t.rings.maxMsg {
			return ub.Completion{Status: ub.StatusLocalLength}
		}
		st = t.deliver(j.c, buf, wr.Op, wr.Imm, wr.Op == ub.OpSendImm, j.cfg.Mode == ub.Unreliable)
		return ub.Completion{Status: st, Len: len(buf)}
	}
	return ub.Completion{Status: ub.StatusUnsupported}
}

func (j *jetty) oneSided(wr *ub.WR) ub.Completion {
	r, ok := wr.Remote.Seg.(*remoteSegment)
	if !ok {
		return ub.Completion{Status: ub.StatusUnsupported}
	}
	if !r.acquire() {
		return ub.Completion{Status: ub.StatusFlushed}
	}
	defer r.release()
	switch wr.Op {
	case ub.OpWrite, ub.OpWriteImm:
		buf, st := j.local(wr.Local)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		r.begin()
		st = r.check(wr.Remote.Offset, len(buf), ub.AccessWrite)
		if st == ub.StatusSuccess {
			copy(r.bytes(wr.Remote.Offset, len(buf)), buf)
		}
		r.end()
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		if wr.Op == ub.OpWriteImm {
			t, st := j.bind.Target(wr.Target)
			if st != ub.StatusSuccess {
				return ub.Completion{Status: st, Len: len(buf)}
			}
			if st := t.deliver(j.c, nil, ub.OpWriteImm, wr.Imm, true, false); st != ub.StatusSuccess {
				return ub.Completion{Status: st, Len: len(buf)}
			}
		}
		return ub.Completion{Len: len(buf)}
	case ub.OpRead:
		buf, st := j.local(wr.Local)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		r.begin()
		st = r.check(wr.Remote.Offset, len(buf), ub.AccessRead)
		if st == ub.StatusSuccess {
			copy(buf, r.bytes(wr.Remote.Offset, len(buf)))
		}
		r.end()
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		return ub.Completion{Len: len(buf)}
	}
	// CAS and FetchAdd.
	r.begin()
	defer r.end()
	if st := r.check(wr.Remote.Offset, 8, ub.AccessAtomic); st != ub.StatusSuccess {
		return ub.Completion{Status: st}
	}
	if wr.Remote.Offset%8 != 0 {
		return ub.Completion{Status: ub.StatusMisaligned}
	}
	// In range (checked): an error is registered memory whose word at
	// an aligned offset is not 8-byte aligned in memory.
	w, err := shm.WordIn(r.mem, wr.Remote.Offset)
	if err != nil {
		return ub.Completion{Status: ub.StatusMisaligned}
	}
	var out []byte
	if wr.Local.Seg != nil {
		wr.Local.Len = 8
		b, st := j.local(wr.Local)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		out = b
	}
	var old uint64
	if wr.Op == ub.OpCAS {
		for {
			old = w.Load()
			if old != wr.Compare || w.CompareAndSwap(old, wr.Swap) {
				break
			}
		}
	} else {
		old = w.Add(wr.Add) - wr.Add
	}
	if out != nil {
		binary.LittleEndian.PutUint64(out, old)
	}
	return ub.Completion{Len: 8, Value: old}
}

// Close marks the jetty gone for senders, flushes its posted receives to the
// RecvCQ and releases the shared memory.
func (j *jetty) Close() error {
	j.c.lockOps()
	defer j.c.ops.Unlock()
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.mu.Unlock()
	j.rings.state.Store(stateDead)
	j.recv.detach(j.rings.compls)
	// Completions peers delivered before the close are still the owner's.
	var c ub.Completion
	for {
		n, err := j.rings.compls.TryPop(j.slot)
		if err != nil {
			break
		}
		if c, err = decodeCompletion(j.slot[:n]); err == nil {
			j.recv.local.Push(c, false)
		}
	}
	for {
		n, err := j.rings.recvs.TryPop(j.slot)
		if err != nil {
			break
		}
		if r, err := decodeRecv(j.slot[:n]); err == nil {
			j.recv.local.Push(ub.Completion{Status: ub.StatusFlushed, Op: ub.OpRecv, UserCtx: r.userCtx}, false)
		}
	}
	j.rings.recvs.Close()
	j.rings.compls.Close()
	j.c.untrack(j)
	return j.rings.seg.Close()
}

// target is a peer's jetty, imported with a token.
type target struct {
	c      *Context
	closed bool // guarded by c.ops
	desc   ub.JettyDesc
	token  ub.Token
	rings  *jettyRings
	mu     sync.Mutex
	peer   peerSeg
	slot   []byte
	once   sync.Once
	// bufs are the peer's segments that its posted receives named, mapped
	// to deliver into them (mu), most recently used first. They go with the
	// target: held by the context, they outlived every connection.
	bufs []mappedBuf
}

// mappedBuf is a peer's segment mapped for deliveries, by name.
type mappedBuf struct {
	name string
	seg  *shm.Segment
}

// maxMappedBufs bounds the segments of its peer a target keeps mapped: a
// receiver whose posted receives name more (one mapping and descriptor
// each) costs this side a mapping per delivery instead of a descriptor
// per name.
const maxMappedBufs = 8

// ImportJetty maps a peer's jetty so sends can reach it.
func (c *Context) ImportJetty(desc ub.JettyDesc, token ub.Token) (ub.Target, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("shmprov: %w: cannot import a %q jetty", ub.ErrBadDescriptor, desc.Provider)
	}
	s, err := openPeerObject(desc.Name, "j")
	if err != nil {
		return nil, err
	}
	rings, err := openJettyRings(s)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("shmprov: %w: jetty %s: %w", ub.ErrBadDescriptor, desc.Name, err)
	}
	t := &target{c: c, desc: desc, token: token, rings: rings, peer: peerSeg{seg: s}, slot: make([]byte, recvSlotSize)}
	if err := c.track(t); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *target) Desc() ub.JettyDesc { return t.desc }

func (t *target) Close() error {
	t.c.lockOps()
	defer t.c.ops.Unlock()
	// Under mu, which a delivery holds while it uses the mappings (a jetty
	// of another context, whose lock is not ours, may be delivering).
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	var err error
	t.once.Do(func() {
		t.rings.recvs.Close()
		t.rings.compls.Close()
		errs := []error{t.rings.seg.Close()}
		for _, b := range t.bufs {
			errs = append(errs, b.seg.Close())
		}
		t.bufs = nil
		t.c.untrack(t)
		err = errors.Join(errs...)
	})
	return err
}

// buf returns the peer's segment called name, mapped (t.mu held). A
// segment that is no longer registered is unmapped, and a new one takes
// the place of the least recently used when maxMappedBufs are mapped.
func (t *target) buf(name []byte) (*shm.Segment, error) {
	for i, b := range t.bufs {
		if b.name == string(name) {
			copy(t.bufs[1:i+1], t.bufs[:i])
			t.bufs[0] = b
			return b.seg, nil
		}
	}
	s, err := shm.OpenSegment(string(name))
	if err != nil {
		return nil, fdlimit.Hint(err)
	}
	if len(t.bufs) == maxMappedBufs {
		t.bufs[len(t.bufs)-1].seg.Close()
		t.bufs = t.bufs[:len(t.bufs)-1]
	}
	t.bufs = append(t.bufs, mappedBuf{})
	copy(t.bufs[1:], t.bufs)
	t.bufs[0] = mappedBuf{name: string(name), seg: s}
	return s, nil
}

// dropBuf unmaps the peer's segment seg, which is no longer registered
// (t.mu held).
func (t *target) dropBuf(seg *shm.Segment) {
	for i, b := range t.bufs {
		if b.seg == seg {
			t.bufs = append(t.bufs[:i], t.bufs[i+1:]...)
			seg.Close()
			return
		}
	}
}

// deliver consumes the target's next posted receive, copies payload into it
// and pushes the receive completion. c is the sending jetty's context,
// whose ops the caller holds for reading. dropIfNone is the unreliable
// mode: no receive means the message is lost, not an error.
func (t *target) deliver(c *Context, payload []byte, op ub.Opcode, imm uint64, hasImm, dropIfNone bool) ub.Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ub.StatusFlushed
	}
	if !t.peer.ownerAlive(time.Now()) {
		return ub.StatusPeerDead
	}
	if t.rings.state.Load() != stateLive {
		return ub.StatusFlushed
	}
	if t.rings.token != t.token {
		return ub.StatusBadToken
	}
	n, err := t.rings.recvs.TryPop(t.slot)
	if err == shm.ErrRingEmpty {
		if dropIfNone {
			return ub.StatusSuccess
		}
		return ub.StatusReceiverNotReady
	}
	if err != nil {
		return ub.StatusRemoteLength
	}
	r, err := decodeRecv(t.slot[:n])
	compl := ub.Completion{Op: ub.OpRecv, UserCtx: r.userCtx, Len: len(payload), Imm: imm, HasImm: hasImm}
	if op == ub.OpWriteImm {
		compl.Op, compl.Len = ub.OpWriteImm, 0
	}
	status := ub.StatusSuccess
	if err != nil {
		status = ub.StatusRemoteLength
	} else if len(payload) > 0 {
		status = t.copyInto(c, r, payload)
	}
	compl.Status = status
	if status != ub.StatusSuccess {
		compl.Len = 0
	}
	encodeCompletion(t.slot, compl)
	if err := t.rings.compls.TryPush(t.slot[:complSlotSize]); err != nil {
		return ub.StatusReceiverNotReady
	}
	return status
}

// copyInto validates a posted receive read from shared memory and copies the
// payload into the receiver's segment.
func (t *target) copyInto(c *Context, r postedRecv, payload []byte) ub.Status {
	if uint64(len(payload)) > uint64(r.len) {
		return ub.StatusRemoteLength
	}
	// The receive names a segment: it must be a live registered segment of
	// the same context (name prefix) and process that own this jetty, and
	// the range must lie inside what it registered. A receiver cannot aim
	// our write at anyone else.
	i := strings.LastIndexByte(t.desc.Name, '-')
	if i < 0 || len(r.name) < i+1 || string(r.name[:i+1]) != t.desc.Name[:i+1] {
		return ub.StatusRemoteLength
	}
	seg := c.importedSeg(r.name)
	if seg == nil {
		var err error
		if seg, err = t.buf(r.name); err != nil {
			return ub.StatusRemoteLength
		}
	}
	d := seg.Data()
	if len(d) < segHeader || seg.Creator() != t.peer.seg.Creator() {
		t.dropBuf(seg)
		return ub.StatusRemoteLength
	}
	magic, _ := seg.Uint64At(0)
	state, _ := seg.Uint32At(segOffState)
	size := binary.LittleEndian.Uint64(d[segOffSize:])
	if magic.Load() != segMagic || state.Load() != stateLive || size > uint64(len(d)-segHeader) {
		// Deregistered (its name is never used again) or not a segment
		// at all: nothing to keep mapped.
		t.dropBuf(seg)
		return ub.StatusRemoteLength
	}
	end := segHeader + size
	if r.off < segHeader || r.off > end || uint64(len(payload)) > end-r.off {
		return ub.StatusRemoteLength
	}
	copy(d[r.off:], payload)
	return ub.StatusSuccess
}
