// Package ubtest is the bus conformance suite ("bus consistency testing"):
// the behaviour every ub provider must show, checked across processes.
//
// A provider's test package runs it in two lines:
//
//	func TestMain(m *testing.M) {
//		ubtest.RunPeerIfChild(open) // the suite re-executes the test binary as peers
//		os.Exit(m.Run())
//	}
//
//	func TestConformance(t *testing.T) { ubtest.Run(t, open) }
//
// where open returns a fresh ub.Context of the provider (RunWith takes
// Options: where to get memory the provider can register). The suite
// checks one-sided Write and Read, memory registered with
// RegisterSegment, token, permission and bounds checks, Send and
// Recv with ordering per jetty, immediate data, receive overrun, atomics
// under contention from several processes, the unreliable mode's rules,
// completion semantics (one completion per request, with its UserCtx, in
// order), flushing on close, peer death, closing under load, the sentinel
// errors of ub for calls that cannot be queued, and ub.Interrupter on
// providers whose CQs implement it (the others skip that check, saying
// so).
//
// The contract it checks, and what it assumes of a provider (peers are
// processes of this test binary on the same host; descriptors travel as
// JSON), is written down in "Writing a provider" in docs/ub.md.
package ubtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// Open returns a new context of the provider under test.
type Open func() (ub.Context, error)

// Memory returns size bytes of memory that the provider under test can
// register (Context.RegisterSegment), valid until the test ends: it
// cleans up with t.Cleanup.
type Memory func(t testing.TB, size int) []byte

// Options gives the suite what some providers need beyond a context.
type Options struct {
	// Memory is where the RegisterSegment checks get their memory. Nil
	// gives a Go slice, which a provider that serves peers from its own
	// process (tcp) registers; shm needs memory in a named shm segment
	// (shm.CreateSegment's Data).
	Memory Memory
}

func (o Options) memory(t testing.TB, size int) []byte {
	if o.Memory != nil {
		return o.Memory(t, size)
	}
	return make([]byte, size)
}

const (
	// EnvPeerWrap, if set, is a command prefix the suite starts its peer
	// processes with, such as "ip netns exec other-host" to put them on
	// another (virtual) host.
	EnvPeerWrap = "UBTEST_PEER_WRAP"
	// EnvPeerEnv adds space-separated NAME=value settings to the peers'
	// environment, such as the address a tcp provider peer listens on.
	EnvPeerEnv = "UBTEST_PEER_ENV"

	envPeer = "UBTEST_PEER"
	// PeerSegmentSize is the size of the segment every peer registers.
	PeerSegmentSize = 1 << 16
	peerToken       = ub.Token(0x5eed)
	msgSize         = 256
)

// hello is what a peer prints when it is ready.
type hello struct {
	Seg      ub.SegmentDesc `json:"seg"`
	ReadOnly ub.SegmentDesc `json:"readOnly"`
	Jetty    ub.JettyDesc   `json:"jetty"`
}

// RunPeerIfChild turns the process into a suite peer when the suite started
// it, and exits; otherwise it returns at once. Call it first in TestMain.
func RunPeerIfChild(open Open) {
	if os.Getenv(envPeer) == "" {
		return
	}
	if err := servePeer(open); err != nil {
		fmt.Fprintf(os.Stderr, "ubtest peer: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// servePeer registers a segment (read/write/atomic), a read-only segment and
// a jetty, prints their descriptors, then obeys one command per stdin line,
// answering one JSON line each.
func servePeer(open Open) error {
	c, err := open()
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.AllocSegment(PeerSegmentSize, ub.SegmentConfig{Access: ub.AccessAtomic, Token: peerToken})
	if err != nil {
		return err
	}
	ro, err := c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessRead, Token: peerToken})
	if err != nil {
		return err
	}
	copy(ro.Bytes(), "read only")
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		return err
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: 256, Token: peerToken})
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(hello{Seg: seg.Desc(), ReadOnly: ro.Desc(), Jetty: j.Desc()}); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	recvBase := PeerSegmentSize / 2
	// Imports made by "remote", kept by descriptor and token so that an
	// access after the owner deregistered goes through the import made
	// before.
	imports := map[string]ub.RemoteSegment{}
	var h *hammer
	defer func() {
		if h != nil {
			h.stop()
		}
	}()
	for in.Scan() {
		line := in.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		arg := func(i int) int {
			if i >= len(f) {
				return 0
			}
			n, _ := strconv.Atoi(f[i])
			return n
		}
		var reply any
		switch f[0] {
		case "recv": // recv N: post N receives of msgSize in the upper half
			n := arg(1)
			wrs := make([]ub.RecvWR, n)
			for i := range wrs {
				wrs[i] = ub.RecvWR{UserCtx: uint64(1000 + i), Buf: ub.Local{Seg: seg, Offset: recvBase + (i%128)*msgSize, Len: msgSize}}
			}
			k, err := j.PostRecv(wrs)
			reply = map[string]any{"posted": k, "err": errString(err)}
		case "poll": // poll N: wait for N completions, report them and the received bytes
			n := arg(1)
			var got []map[string]any
			buf := make([]ub.Completion, n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for len(got) < n {
				if err := cq.Wait(ctx); err != nil {
					break
				}
				k, _ := cq.Poll(buf[:n-len(got)])
				for _, comp := range buf[:k] {
					e := map[string]any{"status": comp.Status.String(), "op": comp.Op.String(), "ctx": comp.UserCtx, "len": comp.Len, "imm": comp.Imm, "hasImm": comp.HasImm}
					if comp.Op == ub.OpRecv && comp.Status == ub.StatusSuccess && comp.UserCtx >= 1000 {
						off := recvBase + int(comp.UserCtx-1000)%128*msgSize
						e["data"] = string(seg.Bytes()[off : off+comp.Len])
					}
					got = append(got, e)
				}
			}
			cancel()
			reply = got
		case "read": // read OFF LEN: bytes of the segment
			off, n := arg(1), arg(2)
			reply = string(seg.Bytes()[off : off+n])
		case "word": // word OFF: the 8-byte word
			reply = binary.LittleEndian.Uint64(seg.Bytes()[arg(1):])
		case "add": // add OFF N SEGJSON: N FetchAdds of 1 on a remote word
			// The descriptor is the rest of the line as it came: its
			// name may hold any characters, spaces too.
			var desc ub.SegmentDesc
			if rest := strings.SplitN(line, " ", 4); len(rest) < 4 || json.Unmarshal([]byte(rest[3]), &desc) != nil {
				reply = "add: want OFF N and a segment descriptor in JSON"
				break
			}
			reply = remoteAdds(c, cq, desc, arg(1), arg(2))
		case "remote": // remote OP TOKEN OFF ARG SEGJSON: one one-sided operation
			// OP is write (ARG the bytes), read (ARG the length) or add
			// (ARG the increment); the descriptor is the rest of the line.
			rest := strings.SplitN(line, " ", 6)
			var desc ub.SegmentDesc
			if len(rest) < 6 || json.Unmarshal([]byte(rest[5]), &desc) != nil {
				reply = "remote: want OP TOKEN OFF ARG and a segment descriptor in JSON"
				break
			}
			reply = remoteOp(c, cq, seg, imports, rest[1], ub.Token(arg(2)), arg(3), rest[4], desc)
		case "hammer", "readhammer":
			// hammer TOKEN OFF LEN SEGJSON: write LEN bytes of 0xAA at
			// OFF over and over, until stophammer; readhammer: read them
			// over and over, each read's bytes checked to be all 0xAA.
			rest := strings.SplitN(line, " ", 5)
			var desc ub.SegmentDesc
			switch {
			case len(rest) < 5 || json.Unmarshal([]byte(rest[4]), &desc) != nil:
				reply = f[0] + ": want TOKEN OFF LEN and a segment descriptor in JSON"
			case h != nil:
				reply = f[0] + ": already hammering"
			default:
				var err error
				h, err = startHammer(c, desc, ub.Token(arg(1)), arg(2), arg(3), f[0] == "readhammer")
				reply = errString(err)
			}
		case "stophammer": // the statuses of the writes hammer made, by name
			if h == nil {
				reply = map[string]int{}
				break
			}
			reply = h.stop()
			h = nil
		case "closejetty":
			reply = errString(j.Close())
		case "exit":
			return nil
		default:
			reply = "unknown command " + f[0]
		}
		if err := out.Encode(reply); err != nil {
			return err
		}
	}
	return in.Err()
}

// remoteAdds does n FetchAdd(1) on the word at off of a peer's segment,
// half of them as CAS loops, and reports failures.
func remoteAdds(c ub.Context, cq ub.CQ, desc ub.SegmentDesc, off, n int) string {
	r, err := c.ImportSegment(desc, peerToken)
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err.Error()
	}
	defer j.Close()
	comp := make([]ub.Completion, 1)
	for i := range n {
		wr := ub.WR{Op: ub.OpFetchAdd, Remote: ub.Remote{Seg: r, Offset: off}, Add: 1}
		if i%2 == 1 {
			// The same increment as a compare-and-swap loop.
			var old uint64
			for {
				w := ub.WR{Op: ub.OpCAS, Remote: ub.Remote{Seg: r, Offset: off}, Compare: old, Swap: old + 1}
				if _, err := j.PostSend([]ub.WR{w}); err != nil {
					return err.Error()
				}
				if err := waitOne(cq, comp); err != nil || comp[0].Status != ub.StatusSuccess {
					return fmt.Sprintf("cas completion %+v %v", comp[0], err)
				}
				if comp[0].Value == old {
					break
				}
				old = comp[0].Value
			}
			continue
		}
		if _, err := j.PostSend([]ub.WR{wr}); err != nil {
			return err.Error()
		}
		if err := waitOne(cq, comp); err != nil || comp[0].Status != ub.StatusSuccess {
			return fmt.Sprintf("fetch-add completion %+v %v", comp[0], err)
		}
	}
	return "ok"
}

// hammer writes into (or reads from) a peer's segment, one request after
// the other, until stopped: a writer or reader that the owner's Close
// meets in the middle of a request.
type hammer struct {
	halt     chan struct{}
	done     chan struct{}
	statuses map[string]int // written by the hammer's goroutine until done
}

// startHammer returns once the first request completed successfully, so
// the owner knows they have begun. A read that completes successfully
// with anything but 0xAA bytes counts as "other bytes".
func startHammer(c ub.Context, desc ub.SegmentDesc, token ub.Token, off, n int, read bool) (*hammer, error) {
	r, err := c.ImportSegment(desc, token)
	if err != nil {
		return nil, err
	}
	loc, err := c.AllocSegment(n, ub.SegmentConfig{})
	if err != nil {
		r.Close()
		return nil, err
	}
	for i := range loc.Bytes() {
		loc.Bytes()[i] = 0xAA
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		loc.Close()
		r.Close()
		return nil, err
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		cq.Close()
		loc.Close()
		r.Close()
		return nil, err
	}
	cleanup := func() {
		j.Close()
		cq.Close()
		loc.Close()
		r.Close()
	}
	comp := make([]ub.Completion, 1)
	op := ub.OpWrite
	if read {
		op = ub.OpRead
	}
	once := func() (string, error) {
		if read {
			clear(loc.Bytes())
		}
		wr := ub.WR{Op: op, Local: ub.Local{Seg: loc, Len: n}, Remote: ub.Remote{Seg: r, Offset: off}}
		if _, err := j.PostSend([]ub.WR{wr}); err != nil {
			return "", err
		}
		if err := waitOne(cq, comp); err != nil {
			return "", err
		}
		if read && comp[0].Status == ub.StatusSuccess && bytes.Count(loc.Bytes()[:n], []byte{0xAA}) != n {
			return "other bytes", nil
		}
		return comp[0].Status.String(), nil
	}
	if st, err := once(); err != nil || st != ub.StatusSuccess.String() {
		cleanup()
		return nil, fmt.Errorf("first %v: %s, %v", op, st, err)
	}
	h := &hammer{halt: make(chan struct{}), done: make(chan struct{}), statuses: map[string]int{ub.StatusSuccess.String(): 1}}
	go func() {
		defer close(h.done)
		defer cleanup()
		for {
			select {
			case <-h.halt:
				return
			default:
			}
			st, err := once()
			if err != nil {
				h.statuses[err.Error()]++
				return
			}
			h.statuses[st]++
		}
	}()
	return h, nil
}

// stop ends the writes, waiting for the one under way, and returns how
// many ended with each status.
func (h *hammer) stop() map[string]int {
	close(h.halt)
	<-h.done
	return h.statuses
}

// remoteResult is the answer to a "remote" command.
type remoteResult struct {
	Status string `json:"status"`
	Data   string `json:"data"`
	Value  uint64 `json:"value"`
	Err    string `json:"err"`
}

// remoteOp runs one Write, Read or FetchAdd on a peer's segment through an
// import made (and kept in imports) with token, using the start of the
// peer's own segment seg as its local buffer.
func remoteOp(c ub.Context, cq ub.CQ, seg ub.Segment, imports map[string]ub.RemoteSegment, op string, token ub.Token, off int, arg string, desc ub.SegmentDesc) remoteResult {
	key, _ := json.Marshal(desc)
	k := fmt.Sprintf("%d %s", token, key)
	r := imports[k]
	if r == nil {
		var err error
		if r, err = c.ImportSegment(desc, token); err != nil {
			return remoteResult{Err: "import: " + err.Error()}
		}
		imports[k] = r
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return remoteResult{Err: err.Error()}
	}
	defer j.Close()
	const scratch = 4096
	wr := ub.WR{Remote: ub.Remote{Seg: r, Offset: off}}
	n, _ := strconv.Atoi(arg)
	switch op {
	case "write":
		copy(seg.Bytes()[scratch:], arg)
		wr.Op, wr.Local = ub.OpWrite, ub.Local{Seg: seg, Offset: scratch, Len: len(arg)}
	case "read":
		wr.Op, wr.Local = ub.OpRead, ub.Local{Seg: seg, Offset: scratch, Len: n}
	case "add":
		wr.Op, wr.Add = ub.OpFetchAdd, uint64(n)
	default:
		return remoteResult{Err: "unknown operation " + op}
	}
	if _, err := j.PostSend([]ub.WR{wr}); err != nil {
		return remoteResult{Err: err.Error()}
	}
	comp := make([]ub.Completion, 1)
	if err := waitOne(cq, comp); err != nil {
		return remoteResult{Err: err.Error()}
	}
	res := remoteResult{Status: comp[0].Status.String(), Value: comp[0].Value}
	if op == "read" && comp[0].Status == ub.StatusSuccess {
		res.Data = string(seg.Bytes()[scratch : scratch+n])
	}
	return res
}

// waitOne waits for one completion (providers may complete asynchronously).
func waitOne(cq ub.CQ, out []ub.Completion) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
		n, err := cq.Poll(out[:1])
		if err != nil || n == 1 {
			return err
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// peer is a running suite peer.
type peer struct {
	t     testing.TB
	cmd   *exec.Cmd
	in    *bufio.Writer
	out   *json.Decoder
	hello hello
}

func startPeer(t testing.TB) *peer {
	t.Helper()
	// PeerWrap runs peers elsewhere, e.g. in another network namespace.
	args := append(strings.Fields(os.Getenv(EnvPeerWrap)), os.Args[0], "-test.run=^$")
	cmd := exec.Command(args[0], args[1:]...)
	// A race-enabled binary sleeps a second at exit unless told not to.
	cmd.Env = append(os.Environ(), envPeer+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, strings.Fields(os.Getenv(EnvPeerEnv))...)
	cmd.Stderr = os.Stderr
	osproc.DieWithParent(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peer: %v", err)
	}
	p := &peer{t: t, cmd: cmd, in: bufio.NewWriter(stdin), out: json.NewDecoder(stdout)}
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		// Ask it to exit so it closes what it made; kill it if it does not.
		fmt.Fprintln(p.in, "exit")
		p.in.Flush()
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	if err := p.out.Decode(&p.hello); err != nil {
		t.Fatalf("peer did not start (is RunPeerIfChild called in TestMain?): %v", err)
	}
	return p
}

// remote has the peer run one one-sided operation on the segment desc
// describes (see remoteOp).
func (p *peer) remote(op string, token ub.Token, off int, arg any, desc ub.SegmentDesc) remoteResult {
	p.t.Helper()
	d, err := json.Marshal(desc)
	if err != nil {
		p.t.Fatal(err)
	}
	var r remoteResult
	p.do(&r, "remote", op, uint32(token), off, arg, string(d))
	return r
}

func (p *peer) do(reply any, cmd string, args ...any) {
	p.t.Helper()
	fmt.Fprintln(p.in, append([]any{cmd}, args...)...)
	p.in.Flush()
	if err := p.out.Decode(reply); err != nil {
		p.t.Fatalf("peer %s: %v", cmd, err)
	}
}

// kill kills the peer with SIGKILL: it leaves what it made behind, as a
// crashed process would (the provider's own cleanup must cope).
func (p *peer) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// shmMemorySeq numbers ShmMemory's segments.
var shmMemorySeq atomic.Uint64

// ShmMemory is a Memory in a new named shm segment (shm.CreateSegment),
// closed and removed when the test ends: memory that every provider of
// ubkit registers, shm included.
func ShmMemory(t testing.TB, size int) []byte {
	t.Helper()
	name := fmt.Sprintf("ubtest-mem-%d-%d", os.Getpid(), shmMemorySeq.Add(1))
	s, err := shm.CreateSegment(name, size, nil)
	if err != nil {
		t.Fatalf("memory to register: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s.Data()[:size:size]
}
