package transport

import (
	"context"
	"net"
	"time"

	"github.com/ubkit-io/ubkit/transport/mux"
	"github.com/ubkit-io/ubkit/ub"
)

// Path says how a connection's bytes travel.
type Path string

// Paths, in the order Dial prefers them.
const (
	// PathShm is the same-node path: shared-memory rings, no system call
	// on the fast path.
	PathShm Path = "shm"
	// PathUB is the path to another node of the super node: the ub verbs
	// provider (sim or tcp without UB hardware).
	PathUB Path = "ub"
	// PathTCP is plain TCP, for nodes outside the super node.
	PathTCP Path = "tcp"
)

// ParsePath checks a path name; "" means "let Dial choose".
func ParsePath(s string) (Path, error) {
	switch p := Path(s); p {
	case "", PathShm, PathUB, PathTCP:
		return p, nil
	}
	return "", &net.AddrError{Err: "unknown path (want shm, ub or tcp)", Addr: s}
}

// impl is what carries one connection: *shmConn on the same node,
// *pktConn on the ub and tcp paths.
type impl interface {
	net.Conn
	CloseWrite() error
	// Loan fails fast; see waitingLoaner.
	Loan(n int) (*Msg, error)
	Send(m *Msg) error
	Recv(ctx context.Context) (*Msg, error)
}

// Conn is a connection over the bus. It is a net.Conn with full semantics
// (deadlines, concurrent Read and Write, graceful Close); CloseWrite
// half-closes it, and Loan, Send and Recv carry messages beside the byte
// stream.
type Conn struct {
	c      impl
	path   Path
	dialed bool       // this side dialed (it opens odd-numbered mux streams)
	dev    ub.Context // the ub path's context, nil on the others
}

var _ net.Conn = (*Conn)(nil)

// Path reports how the connection's bytes travel.
func (c *Conn) Path() Path { return c.path }

// Device is the ub context a PathUB connection runs over (nil on the
// other paths): the endpoint's, shared by its connections, for
// one-sided operations beside the stream (a peer that learns a segment's
// descriptor and token over the connection reads or writes it directly).
// It belongs to the endpoint: do not close it.
func (c *Conn) Device() ub.Context { return c.dev }

// Session starts a session of multiplexed streams over the connection
// (package transport/mux); call it on both sides. The connection then
// belongs to the session.
func (c *Conn) Session(cfg *mux.Config) *mux.Session {
	if c.dialed {
		return mux.Client(c, cfg)
	}
	return mux.Server(c, cfg)
}

func (c *Conn) Read(b []byte) (int, error)  { return c.c.Read(b) }
func (c *Conn) Write(b []byte) (int, error) { return c.c.Write(b) }

// LocalAddr and RemoteAddr carry the path ("ub://n0/svc?path=ub"), so
// whoever sees a peer's address (gRPC's peer.FromContext, say) sees how
// its bytes travel.
func (c *Conn) LocalAddr() net.Addr  { return c.withPath(c.c.LocalAddr()) }
func (c *Conn) RemoteAddr() net.Addr { return c.withPath(c.c.RemoteAddr()) }

func (c *Conn) withPath(a net.Addr) net.Addr {
	if ua, ok := a.(Addr); ok {
		ua.Path = c.path
		return ua
	}
	return a
}
func (c *Conn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

// CloseWrite tells the peer no more data will come: its reads return
// io.EOF once it has read everything. Messages may still be sent.
func (c *Conn) CloseWrite() error { return c.c.CloseWrite() }

// Close closes both directions; blocked calls return net.ErrClosed. Bytes
// and messages already written are delivered before the peer sees the end.
func (c *Conn) Close() error { return c.c.Close() }

// Loan returns a buffer of n bytes to fill and Send. On the shm path it
// lies in shared memory and Send moves no bytes; on the others it is
// ordinary memory that Send copies onto the wire. On the shm path the
// buffers are a fixed pool the peer gives back as it releases what it
// received: when none fits, Loan waits for one until the write deadline
// passes (os.ErrDeadlineExceeded) or the connection closes
// (net.ErrClosed). LoanContext also ends with a context; TryLoan does not
// wait.
func (c *Conn) Loan(n int) (*Msg, error) { return c.LoanContext(context.Background(), n) }

// LoanContext is Loan that also stops waiting when ctx ends, returning
// ctx.Err().
func (c *Conn) LoanContext(ctx context.Context, n int) (*Msg, error) {
	if w, ok := c.c.(waitingLoaner); ok {
		return w.loanWait(ctx, n)
	}
	return c.c.Loan(n)
}

// TryLoan is Loan that never waits: with no buffer free it fails at once
// with an error matching ErrPoolExhausted.
func (c *Conn) TryLoan(n int) (*Msg, error) { return c.c.Loan(n) }

// waitingLoaner is a path whose buffers can run out (shm): its Loan fails
// fast and loanWait waits.
type waitingLoaner interface {
	loanWait(ctx context.Context, n int) (*Msg, error)
}

// Send hands a loaned buffer to the peer; m must not be used afterwards.
func (c *Conn) Send(m *Msg) error { return c.c.Send(m) }

// Recv returns the next message, waiting until one arrives, ctx ends or the
// connection closes. Release it when done.
func (c *Conn) Recv(ctx context.Context) (*Msg, error) { return c.c.Recv(ctx) }
