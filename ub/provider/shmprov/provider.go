package shmprov

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

// Name is the provider's registered name.
const Name = "shm"

func init() { ub.Register(Name, provider{}) }

type provider struct{}

func (provider) Open(_ context.Context, cfg ub.Config) (ub.Context, error) {
	var eid ub.EID
	if _, err := io.ReadFull(rand.Reader, eid[:]); err != nil {
		return nil, err
	}
	c := &Context{eid: eid, prefix: "ub-" + hex.EncodeToString(eid[:6]), sleeping: map[*cq]struct{}{}, imported: map[string]*remoteSegment{}}
	return c, nil
}

// errClosed is returned for calls on a closed object.
var errClosed = fmt.Errorf("shmprov: %w", ub.ErrClosed)

// Context is an endpoint of the shm provider.
type Context struct {
	eid    ub.EID
	prefix string
	seq    atomic.Uint64

	// ops is held for reading by every operation (posts, polls) and for
	// writing by every Close, so nothing is unmapped under an operation.
	ops sync.RWMutex
	// Waits on a CQ's ring sleep holding ops for reading; a Close that
	// wants it for writing first counts itself in opsWanted and kicks the
	// CQs in sleeping, whose waits then return.
	opsWanted atomic.Int32
	smu       sync.Mutex
	sleeping  map[*cq]struct{}

	mu      sync.Mutex
	closed  bool
	objects verbs.Objects // open segments, imports, queues and jetties

	// imported are the peers' segments imported here, by name (the first
	// import of each): a send into a receive posted in one of them copies
	// through that mapping rather than one more of the same memory, so a
	// connection takes its descriptors when it is set up, not at its
	// first message. Closing one takes ops for writing, so a delivery
	// under ops for reading may use it.
	imu      sync.RWMutex
	imported map[string]*remoteSegment
}

// peerSeg is a peer's shm segment this context mapped, with a cached answer
// to "is its owner alive".
type peerSeg struct {
	seg       *shm.Segment
	checkedAt time.Time
	alive     bool
}

// livenessEvery bounds how stale a cached liveness answer may be.
const livenessEvery = 10 * time.Millisecond

func (p *peerSeg) ownerAlive(now time.Time) bool {
	if now.Sub(p.checkedAt) >= livenessEvery {
		p.alive = p.seg.Creator().Alive()
		p.checkedAt = now
	}
	return p.alive
}

func (c *Context) EID() ub.EID      { return c.eid }
func (c *Context) Provider() string { return Name }

func (c *Context) name(kind string) string {
	return fmt.Sprintf("%s-%s%d", c.prefix, kind, c.seq.Add(1))
}

// checkName says why name, from a peer's descriptor, is not one that a
// context makes for kind ("s", "r" or "j"): "ub-", 12 hex digits, "-",
// kind and a number.
func checkName(name, kind string) error {
	rest, ok := strings.CutPrefix(name, "ub-")
	if ok && len(rest) > 13 && rest[12] == '-' {
		_, hexErr := hex.DecodeString(rest[:12])
		seq, isKind := strings.CutPrefix(rest[13:], kind)
		if _, err := strconv.ParseUint(seq, 10, 64); hexErr == nil && isKind && err == nil {
			return nil
		}
	}
	what := map[string]string{"s": "segment", "r": "registered segment", "j": "jetty"}[kind]
	return fmt.Errorf("shmprov: %w: %q is not the name of an shm %s", ub.ErrBadDescriptor, name, what)
}

// openPeerObject maps the shared memory a peer's descriptor names; a name
// that names nothing is a bad descriptor.
func openPeerObject(name, kind string) (*shm.Segment, error) {
	if err := checkName(name, kind); err != nil {
		return nil, err
	}
	s, err := shm.OpenSegment(name)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, shm.ErrCorrupt):
		return nil, fmt.Errorf("shmprov: %w: %s: %w", ub.ErrBadDescriptor, name, err)
	case err != nil:
		return nil, fmt.Errorf("shmprov: import %s: %w", name, fdlimit.Hint(err))
	}
	return s, nil
}

func (c *Context) track(o io.Closer) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	c.objects.Add(o)
	return nil
}

// untrack forgets an object that was closed, so the context holds nothing
// of it.
func (c *Context) untrack(o io.Closer) {
	c.mu.Lock()
	c.objects.Remove(o)
	c.mu.Unlock()
}

// lockOps takes ops for writing, first ending the waits asleep under it
// for reading.
func (c *Context) lockOps() {
	c.opsWanted.Add(1)
	c.smu.Lock()
	qs := make([]*cq, 0, len(c.sleeping))
	for q := range c.sleeping {
		qs = append(qs, q)
	}
	c.smu.Unlock()
	for _, q := range qs {
		q.kickSleep()
	}
	c.ops.Lock()
	c.opsWanted.Add(-1)
}

// Close closes everything the context made or imported.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	objs := c.objects.Drain()
	c.mu.Unlock()
	// Registrations are deregistered all at once and drained against one
	// deadline, so that importers killed mid-access cost Close
	// drainPatience once, not once per segment.
	for _, o := range objs {
		if s, ok := o.(*segment); ok && s.registered {
			s.state.Store(stateDead)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainPatience)
	defer cancel()
	var errs []error
	for _, o := range objs {
		if s, ok := o.(*segment); ok {
			errs = append(errs, s.close(ctx))
			continue
		}
		errs = append(errs, o.Close())
	}
	return errors.Join(errs...)
}

// segment is a registered local segment.
type segment struct {
	c      *Context
	closed bool // guarded by c.ops
	shm    *shm.Segment
	name   string
	// nameBytes is name, as posted receives carry it.
	nameBytes []byte
	bytes     []byte
	state     *atomic.Uint32
	// inflight counts the importers' accesses under way (drain); only
	// a registration has one: an allocated segment's memory goes with
	// it, so nobody waits for its accesses.
	inflight *atomic.Uint32
	once     sync.Once
	// registered: bytes are the caller's (RegisterSegment), and shm is
	// the registration, not the memory.
	registered bool
}

// AllocSegment allocates size bytes in a new shared-memory segment and
// registers them with cfg's access flags and token.
func (c *Context) AllocSegment(size int, cfg ub.SegmentConfig) (ub.Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shmprov: %w: segment size %d must be positive", ub.ErrInvalidArgument, size)
	}
	name := c.name("s")
	s, err := shm.CreateSegment(name, segHeader+size, &shm.SegmentConfig{})
	if err != nil {
		return nil, fmt.Errorf("shmprov: allocate segment: %w", fdlimit.Hint(err))
	}
	d := s.Data()
	binary.LittleEndian.PutUint32(d[segOffToken:], uint32(cfg.Token))
	binary.LittleEndian.PutUint32(d[segOffAccess:], uint32(cfg.Access.Normalize()))
	binary.LittleEndian.PutUint64(d[segOffSize:], uint64(size))
	state, _ := s.Uint32At(segOffState)
	state.Store(stateLive)
	magic, _ := s.Uint64At(0)
	magic.Store(segMagic)
	seg := &segment{c: c, shm: s, name: name, nameBytes: []byte(name), bytes: d[segHeader : segHeader+size : segHeader+size], state: state}
	if err := c.track(seg); err != nil {
		s.Close()
		return nil, err
	}
	return seg, nil
}

func (s *segment) Bytes() []byte { return s.bytes }

func (s *segment) Desc() ub.SegmentDesc {
	return ub.SegmentDesc{Provider: Name, EID: s.c.eid, Name: s.name, Size: len(s.bytes)}
}

// Close deregisters the segment: peers' later accesses fail, and those
// under way have ended when it returns (drain), so no peer writes
// registered memory once it is the caller's again. Peers that mapped it
// keep a valid mapping, so nobody faults. Registered memory is the
// caller's: only the registration goes.
//
// Only a registration waits: an allocated segment's memory goes with it,
// so a late write there is nobody's, and waiting for an importer killed
// mid-access would only hold its owner up.
func (s *segment) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), drainPatience)
	defer cancel()
	return s.close(ctx)
}

// close is Close, draining a registration until ctx ends.
func (s *segment) close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.state.Store(stateDead)
		if s.registered {
			err = s.drain(ctx)
		}
		s.c.lockOps()
		defer s.c.ops.Unlock()
		s.closed = true
		err = errors.Join(err, s.shm.Close())
		s.c.untrack(s)
	})
	return err
}

// drainPatience bounds how long Close waits for the peers' accesses under
// way: an importer killed in the middle of one never takes it off the
// count. A live one copies at memory speed, a gigabyte in well under a
// second.
var drainPatience = 2 * time.Second

// errInFlight: Close deregistered, but peers' accesses were still counted
// after drainPatience.
var errInFlight = errors.New("a peer's access was still under way")

// drain waits until no importer's access is under way. An importer counts
// itself in the in-flight word, then reads the state, then copies, then
// counts itself out (remoteSegment.begin, end); Close stores the dead
// state first, so an access that saw the state live is counted before
// drain looks, and one counted later sees it dead and copies nothing.
// The importer that brings the count to zero after the state went dead
// wakes drain's futex.
func (s *segment) drain(ctx context.Context) error {
	if s.inflight.Load() == 0 {
		return nil
	}
	zero := func(n uint32) bool { return n == 0 }
	if err := (shm.Wait{}).Until(ctx, s.inflight, zero); err != nil {
		return fmt.Errorf("shmprov: deregistered %s, but %w after %v (%d counted: an importer killed in the middle of an access leaves its count behind, or one is that slow): the memory may still be written", s.name, errInFlight, drainPatience, s.inflight.Load())
	}
	return nil
}

// remoteSegment is a peer's segment, imported with a token.
type remoteSegment struct {
	// peerSeg's seg holds the token, access and state: the segment
	// itself, or a registration.
	peerSeg
	c     *Context
	desc  ub.SegmentDesc
	token ub.Token
	size  int
	// mem is the segment's memory in this process, size bytes; target is
	// the segment a registration's memory lies in (nil for an allocated
	// segment, whose memory follows its header).
	mem    []byte
	target *shm.Segment
	// state and inflight are the owner's words in seg (segment.drain).
	state    *atomic.Uint32
	inflight *atomic.Uint32
	mu       sync.Mutex // guards the liveness cache
	// use is held for reading by every access and for writing by Close, so
	// the mapping is never unmapped under an operation.
	use    sync.RWMutex
	closed bool
}

// ImportSegment maps a peer's segment. The token is checked on every access,
// as the target of a real bus would.
func (c *Context) ImportSegment(desc ub.SegmentDesc, token ub.Token) (ub.RemoteSegment, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("shmprov: %w: cannot import a %q segment", ub.ErrBadDescriptor, desc.Provider)
	}
	if checkName(desc.Name, "s") != nil && checkName(desc.Name, "r") == nil {
		return c.importRegistration(desc, token)
	}
	s, err := openPeerObject(desc.Name, "s")
	if err != nil {
		return nil, err
	}
	d := s.Data()
	if len(d) < segHeader {
		s.Close()
		return nil, fmt.Errorf("shmprov: %w: %s is too small to be a registered segment", ub.ErrBadDescriptor, desc.Name)
	}
	magic, _ := s.Uint64At(0)
	size := binary.LittleEndian.Uint64(d[segOffSize:])
	if magic.Load() != segMagic || size > uint64(len(d)-segHeader) {
		s.Close()
		return nil, fmt.Errorf("shmprov: %w: %s is not a registered segment", ub.ErrBadDescriptor, desc.Name)
	}
	end := segHeader + int(size)
	state, _ := s.Uint32At(segOffState)
	r := &remoteSegment{peerSeg: peerSeg{seg: s}, c: c, desc: desc, token: token, size: int(size), mem: d[segHeader:end:end], state: state}
	if err := c.track(r); err != nil {
		s.Close()
		return nil, err
	}
	c.imu.Lock()
	if c.imported[desc.Name] == nil {
		c.imported[desc.Name] = r
	}
	c.imu.Unlock()
	return r, nil
}

// importedSeg returns the mapping of the peer's segment called name if it
// was imported here (ops held for reading keeps it mapped).
func (c *Context) importedSeg(name []byte) *shm.Segment {
	c.imu.RLock()
	defer c.imu.RUnlock()
	if r := c.imported[string(name)]; r != nil {
		return r.seg
	}
	return nil
}

func (r *remoteSegment) Desc() ub.SegmentDesc { return r.desc }

func (r *remoteSegment) Close() error {
	r.c.lockOps()
	defer r.c.ops.Unlock()
	r.use.Lock()
	defer r.use.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.c.untrack(r)
	r.c.imu.Lock()
	if r.c.imported[r.desc.Name] == r {
		delete(r.c.imported, r.desc.Name)
	}
	r.c.imu.Unlock()
	if r.target != nil {
		return errors.Join(r.target.Close(), r.seg.Close())
	}
	return r.seg.Close()
}

// acquire holds the mapping for one operation; it reports false once the
// segment was closed.
func (r *remoteSegment) acquire() bool {
	r.use.RLock()
	if r.closed {
		r.use.RUnlock()
		return false
	}
	return true
}

func (r *remoteSegment) release() { r.use.RUnlock() }

// check decides whether an access of n bytes at off with the needed rights
// may go ahead, reading the owner's current token, flags and state.
func (r *remoteSegment) check(off, n int, need ub.Access) ub.Status {
	r.mu.Lock()
	alive := r.ownerAlive(time.Now())
	r.mu.Unlock()
	if !alive {
		return ub.StatusPeerDead
	}
	d := r.seg.Data()
	if r.state.Load() != stateLive {
		return ub.StatusNoPermission
	}
	if ub.Token(binary.LittleEndian.Uint32(d[segOffToken:])) != r.token {
		return ub.StatusBadToken
	}
	have := ub.Access(binary.LittleEndian.Uint32(d[segOffAccess:])).Normalize()
	if have&need != need {
		return ub.StatusNoPermission
	}
	if off < 0 || n < 0 || off > r.size || n > r.size-off {
		return ub.StatusOutOfBounds
	}
	return ub.StatusSuccess
}

// begin counts an access in the owner's in-flight word, before check
// reads the state; end counts it out once the memory is no longer
// touched (segment.drain).
// An allocated segment's accesses are not counted (inflight nil): no
// Close waits for them, and they are transport's hot path.
func (r *remoteSegment) begin() {
	if r.inflight != nil {
		r.inflight.Add(1)
	}
}

func (r *remoteSegment) end() {
	if r.inflight != nil && r.inflight.Add(^uint32(0)) == 0 && r.state.Load() != stateLive {
		shm.Wake(r.inflight)
	}
}

func (r *remoteSegment) bytes(off, n int) []byte {
	return r.mem[off : off+n : off+n]
}
