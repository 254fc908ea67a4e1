// Package ubsuite is the `ubctl bench ub` suite: the verbs of the ub
// providers against the work they stand for (a memcpy, a TCP round trip),
// each between two processes.
package ubsuite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/shmprov"
	"github.com/ubkit-io/ubkit/ub/provider/tcpprov"
)

const (
	mib       = 1 << 20
	segSize   = 4 * mib
	token     = ub.Token(0xbe4c)
	recvSlots = 256
	sendSize  = 64
)

// Cases returns the suite's cases.
func Cases() []bench.Case {
	memcpy := func(size int) bench.Contender {
		return bench.Contender{Name: "memcpy", Run: func(d time.Duration) (bench.Measurement, error) { return memcpyRun(d, size) }}
	}
	return append([]bench.Case{
		{Name: "shm-write-64B", Unit: "ns/op", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return oneSided(d, shmprov.Name, ub.OpWrite, 64) }}, memcpy(64)}},
		{Name: "shm-read-64B", Unit: "ns/op", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return oneSided(d, shmprov.Name, ub.OpRead, 64) }}, memcpy(64)}},
		{Name: "shm-send-64B", Unit: "ns/op", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: shmSend}, memcpy(64)}},
		{Name: "shm-write-1MiB", Unit: "GB/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return oneSided(d, shmprov.Name, ub.OpWrite, mib) }}, memcpy(mib)}},
		{Name: "tcp-write-64B", Unit: "ns/op", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return oneSided(d, tcpprov.Name, ub.OpWrite, 64) }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return tcpAck(d, 64) }}}},
		{Name: "tcp-write-1MiB", Unit: "GB/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return oneSided(d, tcpprov.Name, ub.OpWrite, mib) }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return tcpAck(d, mib) }}}},
	}, append(simCases(), topoCases()...)...)
}

// peerHello is what the peer prints once it is ready.
type peerHello struct {
	Seg   ub.SegmentDesc `json:"seg"`
	Jetty ub.JettyDesc   `json:"jetty"`
}

func init() {
	bench.RegisterPeer("ub-peer", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return providerPeer(a)
	})
}

// peerArgs say which provider a peer opens, with which options.
type peerArgs struct {
	Provider string            `json:"provider"`
	Options  map[string]string `json:"options,omitempty"`
}

// providerPeer registers a segment and a jetty, keeps receives posted, and
// consumes what arrives (summing every received byte) until it is killed.
func providerPeer(a peerArgs) error {
	c, err := ub.Open(context.Background(), a.Provider, ub.Config{Options: a.Options})
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.AllocSegment(segSize, ub.SegmentConfig{Access: ub.AccessAtomic, Token: token})
	if err != nil {
		return err
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		return err
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: recvSlots, Token: token})
	if err != nil {
		return err
	}
	post := func(slot int) error {
		_, err := j.PostRecv([]ub.RecvWR{{UserCtx: uint64(slot), Buf: ub.Local{Seg: seg, Offset: slot * sendSize, Len: sendSize}}})
		return err
	}
	for i := range recvSlots {
		if err := post(i); err != nil {
			return err
		}
	}
	w := bufio.NewWriter(os.Stdout)
	json.NewEncoder(w).Encode(peerHello{Seg: seg.Desc(), Jetty: j.Desc()})
	w.Flush()
	comps := make([]ub.Completion, 64)
	var sum uint64
	for {
		if err := cq.Wait(context.Background()); err != nil {
			return err
		}
		n, err := cq.Poll(comps)
		if err != nil {
			return err
		}
		for _, comp := range comps[:n] {
			if comp.Status != ub.StatusSuccess {
				return fmt.Errorf("receive: %v", comp.Status)
			}
			off := int(comp.UserCtx) * sendSize
			sum += bench.Sum(seg.Bytes()[off : off+comp.Len])
			if err := post(int(comp.UserCtx)); err != nil {
				return err
			}
		}
	}
}

// session is this process's side: a context, a local segment, a jetty, and
// the peer's segment and jetty imported.
type session struct {
	peer   *bench.Peer
	c      ub.Context
	seg    ub.Segment
	cq     ub.CQ
	j      ub.Jetty
	remote ub.RemoteSegment
	target ub.Target
}

func startSession(provider string) (*session, error) {
	return startSessionWith(peerArgs{Provider: provider}, nil)
}

// startSessionWith starts a peer with peer's settings and opens this side
// with ours (nil: the same provider, no options).
func startSessionWith(peer peerArgs, ours map[string]string) (*session, error) {
	provider := peer.Provider
	p, err := bench.StartPeerPipe("ub-peer", peer)
	if err != nil {
		return nil, err
	}
	var hello peerHello
	if err := json.NewDecoder(p.Stdout()).Decode(&hello); err != nil {
		p.Kill()
		return nil, fmt.Errorf("peer hello: %w", err)
	}
	s := &session{peer: p}
	fail := func(err error) (*session, error) { s.close(); return nil, err }
	if s.c, err = ub.Open(context.Background(), provider, ub.Config{Options: ours}); err != nil {
		return fail(err)
	}
	if s.seg, err = s.c.AllocSegment(segSize, ub.SegmentConfig{Token: token}); err != nil {
		return fail(err)
	}
	if s.cq, err = s.c.NewCQ(ub.CQConfig{}); err != nil {
		return fail(err)
	}
	if s.j, err = s.c.NewJetty(ub.JettyConfig{SendCQ: s.cq, RecvCQ: s.cq}); err != nil {
		return fail(err)
	}
	if s.remote, err = s.c.ImportSegment(hello.Seg, token); err != nil {
		return fail(err)
	}
	if s.target, err = s.c.ImportJetty(hello.Jetty, token); err != nil {
		return fail(err)
	}
	return s, nil
}

func (s *session) close() {
	if s.c != nil {
		s.c.Close()
	}
	s.peer.Kill()
	// The peer was killed, as a crashed process would be: its shared
	// memory goes the way a crashed process's does.
	shm.Sweep()
}

// run posts wr (with the local buffer filled first, for writes and sends)
// and polls its completion, repeatedly for about d.
func (s *session) run(d time.Duration, wr ub.WR, size int) (bench.Measurement, error) {
	comp := make([]ub.Completion, 1)
	wrs := []ub.WR{wr}
	buf := s.seg.Bytes()[:size]
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 64 {
			if wr.Op != ub.OpRead {
				bench.Fill(buf, uint64(n))
			}
			if _, err := s.j.PostSend(wrs); err != nil {
				return bench.Measurement{}, err
			}
			for {
				k, err := s.cq.Poll(comp)
				if err != nil {
					return bench.Measurement{}, err
				}
				if k == 1 {
					break
				}
				// Asynchronous providers (tcp): sleep until it arrives.
				if err := s.cq.Wait(context.Background()); err != nil {
					return bench.Measurement{}, err
				}
			}
			if comp[0].Status != ub.StatusSuccess {
				if comp[0].Status == ub.StatusReceiverNotReady {
					continue // the peer has not reposted yet: try again
				}
				return bench.Measurement{}, comp[0].Err()
			}
			if wr.Op == ub.OpRead {
				bench.Sum(buf)
			}
			n++
		}
	}
	el := time.Since(start)
	if size >= 4096 {
		return bench.Measurement{Value: float64(n) * float64(size) / el.Seconds() / 1e9}, nil
	}
	return bench.Measurement{Value: float64(el.Nanoseconds()) / float64(n)}, nil
}

func oneSided(d time.Duration, provider string, op ub.Opcode, size int) (bench.Measurement, error) {
	s, err := startSession(provider)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	return s.run(d, ub.WR{Op: op, Local: ub.Local{Seg: s.seg, Len: size}, Remote: ub.Remote{Seg: s.remote}}, size)
}

func shmSend(d time.Duration) (bench.Measurement, error) {
	s, err := startSession(shmprov.Name)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	return s.run(d, ub.WR{Op: ub.OpSend, Local: ub.Local{Seg: s.seg, Len: sendSize}, Target: s.target}, sendSize)
}

// memcpyRun is the baseline: the same payload produced (or consumed) and
// copied once with copy(), into memory shared with another process.
func memcpyRun(d time.Duration, size int) (bench.Measurement, error) {
	s, err := startSession(shmprov.Name)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	src := make([]byte, size)
	// The destination is a shared segment, as for the verbs.
	dst := s.seg.Bytes()[mib : mib+size]
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 64 {
			bench.Fill(src, uint64(n))
			copy(dst, src)
			n++
		}
	}
	el := time.Since(start)
	if size >= 4096 {
		return bench.Measurement{Value: float64(n) * float64(size) / el.Seconds() / 1e9}, nil
	}
	return bench.Measurement{Value: float64(el.Nanoseconds()) / float64(n)}, nil
}
