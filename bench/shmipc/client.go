package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	shmipc "github.com/cloudwego/shmipc-go"
)

func runClient(opts options, sock, prefix string) (*result, error) {
	smc := shmipc.DefaultSessionManagerConfig()
	smc.Config = newConfig(opts.spec, opts.batch, opts.shmCap, opts.memfd, prefix)
	smc.Network = "unix"
	smc.Address = sock
	smc.SessionNum = 1
	sm, err := shmipc.NewSessionManager(smc)
	if err != nil {
		return nil, fmt.Errorf("create shmipc session manager: %w", err)
	}
	defer sm.Close()
	st, err := sm.GetStream()
	if err != nil {
		return nil, fmt.Errorf("open shmipc stream: %w", err)
	}

	var res *result
	var serverErrs uint64
	if opts.spec.pingpong {
		res, serverErrs, err = runPingpong(st, opts)
	} else {
		res, serverErrs, err = runStream(st, opts)
	}
	if err != nil {
		return nil, err
	}
	_, stab, _ := st.Session().GetMetrics()
	clientErrs := stab.FallbackWriteCount + stab.AllocShmErrorCount + stab.QueueFullErrorCount
	logf("client metrics: %+v; server error counters: %d", stab, serverErrs)
	if clientErrs+serverErrs != 0 {
		msg := fmt.Sprintf("shmipc-go did not stay on shared memory: client fallbackWrite=%d allocShmError=%d queueFull=%d, server error counters=%d",
			stab.FallbackWriteCount, stab.AllocShmErrorCount, stab.QueueFullErrorCount, serverErrs)
		if !opts.allowFallback {
			return nil, errors.New(msg + " (rerun with -allow-fallback to report anyway)")
		}
		fmt.Fprintf(os.Stderr, "shmipc-bench: warning: %s\n", msg)
	}
	return res, nil
}

// timer returns a flag that becomes true after d.
func timer(d time.Duration) *atomic.Bool {
	var stop atomic.Bool
	time.AfterFunc(d, func() { stop.Store(true) })
	return &stop
}

// ---------------------------------------------------------------- pingpong

type pingpong struct {
	st       *shmipc.Stream
	seq      uint64 // requests answered so far (also the next request's word 0)
	checksum uint64 // wrapping sum of all request words sent
}

// roundTrip sends one 64-byte request (every byte written), waits for the
// 64-byte reply and reads every byte of it.
func (c *pingpong) roundTrip() error {
	st := c.st
	p, err := st.BufferWriter().Reserve(msgSize64)
	if err != nil {
		return fmt.Errorf("reserve request: %w", err)
	}
	_ = p[63]
	base := seqBase(c.seq)
	binary.LittleEndian.PutUint64(p[0:8], c.seq)
	binary.LittleEndian.PutUint64(p[8:16], base+1)
	binary.LittleEndian.PutUint64(p[16:24], base+2)
	binary.LittleEndian.PutUint64(p[24:32], base+3)
	binary.LittleEndian.PutUint64(p[32:40], base+4)
	binary.LittleEndian.PutUint64(p[40:48], base+5)
	binary.LittleEndian.PutUint64(p[48:56], base+6)
	binary.LittleEndian.PutUint64(p[56:64], base+7)
	reqSum := c.seq + 7*base + 28
	if err := st.Flush(false); err != nil {
		return fmt.Errorf("flush request: %w", err)
	}
	q, err := st.BufferReader().ReadBytes(msgSize64)
	if err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	got := sumWords(q)
	// Release the reply and reuse its shm slice for the next request
	// (shmipc-go's recommended request/response pattern).
	st.ReleaseReadAndReuse()
	if want := 8*reqSum + 28; got != want {
		return fmt.Errorf("checksum mismatch on round trip %d: reply sums to %#x, want %#x", c.seq, got, want)
	}
	c.seq++
	c.checksum += reqSum
	return nil
}

// quit asks the server to stop and returns its view of the totals.
func (c *pingpong) quit() (n, sum, errs uint64, err error) {
	st := c.st
	p, err := st.BufferWriter().Reserve(msgSize64)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reserve quit: %w", err)
	}
	for i := 0; i < msgSize64; i += 8 {
		binary.LittleEndian.PutUint64(p[i:i+8], quitWord)
	}
	if err := st.Flush(false); err != nil {
		return 0, 0, 0, fmt.Errorf("flush quit: %w", err)
	}
	q, err := st.BufferReader().ReadBytes(msgSize64)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read quit reply: %w", err)
	}
	n = binary.LittleEndian.Uint64(q[0:8])
	sum = binary.LittleEndian.Uint64(q[8:16])
	errs = binary.LittleEndian.Uint64(q[16:24])
	st.BufferReader().ReleasePreviousRead()
	return n, sum, errs, nil
}

func runPingpong(st *shmipc.Stream, opts options) (*result, uint64, error) {
	c := &pingpong{st: st}

	warm := opts.duration / 10
	stop := timer(warm)
	for !stop.Load() {
		if err := c.roundTrip(); err != nil {
			return nil, 0, err
		}
	}
	warmOps := c.seq

	// Pre-size and pre-fault the latency buffer from the warm-up rate.
	est := int(float64(warmOps)*float64(opts.duration)/float64(max(warm, time.Millisecond))*1.5) + 4096
	lat := make([]int64, est)
	for i := range lat {
		lat[i] = 0
	}

	n := 0
	stop = timer(opts.duration)
	prev := time.Now()
	for !stop.Load() {
		if err := c.roundTrip(); err != nil {
			return nil, 0, err
		}
		now := time.Now()
		d := int64(now.Sub(prev))
		prev = now
		if n < len(lat) {
			lat[n] = d
		} else {
			lat = append(lat, d)
		}
		n++
	}
	lat = lat[:n]

	sn, ssum, serrs, err := c.quit()
	if err != nil {
		return nil, 0, err
	}
	if sn != c.seq || ssum != c.checksum {
		return nil, 0, fmt.Errorf("checksum mismatch: client sent %d requests with checksum %#x, server consumed %d with checksum %#x",
			c.seq, c.checksum, sn, ssum)
	}
	if n == 0 {
		return nil, 0, errors.New("no round trips completed")
	}
	slices.Sort(lat)
	var median float64
	if n%2 == 1 {
		median = float64(lat[n/2])
	} else {
		median = (float64(lat[n/2-1]) + float64(lat[n/2])) / 2
	}
	p99 := float64(lat[rank(n, 0.99)])
	p50 := median
	logf("pingpong: warm-up %d ops, measured %d ops, min %d ns, max %d ns", warmOps, n, lat[0], lat[n-1])
	return &result{
		Case:   opts.spec.name,
		Unit:   opts.spec.unit,
		Better: opts.spec.better,
		Value:  median,
		P50:    &p50,
		P99:    &p99,
		Ops:    uint64(n),
	}, serrs, nil
}

// rank returns the nearest-rank index of percentile p in n sorted samples.
func rank(n int, p float64) int {
	i := int(float64(n)*p+0.999999999) - 1
	return min(max(i, 0), n-1)
}

// ---------------------------------------------------------------- streams

type streamClient struct {
	st       *shmipc.Stream
	msgSize  int
	perFrame int
	window   uint64 // max frames sent but not yet acknowledged as consumed
	ackEvery uint64 // every ackEvery-th frame asks the server for an ack

	sent  uint64 // frames sent (cumulative)
	acked uint64 // frames the server confirmed consumed (cumulative)
	seq   uint64 // messages sent (cumulative), drives the payload pattern

	msgs uint64 // messages since the last sync
	sum  uint64 // checksum since the last sync

	private []byte // with -copy: the payload is produced here, then copied
}

// readControl reads one server->client control frame.
func (c *streamClient) readControl() (frameHeader, error) {
	h, err := readHeader(c.st)
	if err != nil {
		return h, fmt.Errorf("read control frame: %w", err)
	}
	c.st.BufferReader().ReleasePreviousRead()
	if h.kind == kindAck {
		if h.a > c.acked {
			c.acked = h.a
		}
	}
	return h, nil
}

// sendFrame writes one flush worth of messages (header + perFrame messages,
// every payload byte written) and flushes it once.
func (c *streamClient) sendFrame() error {
	// Flow control: shmipc-go has no back-pressure of its own (when the
	// shared buffer runs out it silently falls back to copying the data over
	// the unix socket), so keep at most `window` flushes in flight.
	for c.sent-c.acked >= c.window {
		h, err := c.readControl()
		if err != nil {
			return err
		}
		if h.kind != kindAck {
			return fmt.Errorf("unexpected control frame kind %d while waiting for ack", h.kind)
		}
	}
	c.sent++
	var flags uint32
	if c.sent%c.ackEvery == 0 {
		flags = flagAckReq
	}
	hdr := frameHeader{kind: kindData, count: uint32(c.perFrame), flags: flags, a: c.sent}
	w := c.st.BufferWriter()
	if c.perFrame == 1 {
		p, err := w.Reserve(headerSize + c.msgSize)
		if err != nil {
			return fmt.Errorf("reserve frame: %w", err)
		}
		putHeader(p[:headerSize], hdr)
		base := seqBase(c.seq)
		if c.private != nil {
			fillPattern(c.private, base)
			copy(p[headerSize:], c.private)
		} else {
			fillPattern(p[headerSize:], base)
		}
		c.sum += patternSum(base, uint64(c.msgSize/8))
		c.seq++
	} else {
		p, err := w.Reserve(headerSize)
		if err != nil {
			return fmt.Errorf("reserve frame header: %w", err)
		}
		putHeader(p, hdr)
		for i := 0; i < c.perFrame; i++ {
			m, err := w.Reserve(c.msgSize)
			if err != nil {
				return fmt.Errorf("reserve message: %w", err)
			}
			base := seqBase(c.seq)
			fillPattern(m, base)
			c.sum += patternSum(base, uint64(c.msgSize/8))
			c.seq++
		}
	}
	c.msgs += uint64(c.perFrame)
	if err := c.st.Flush(false); err != nil {
		return fmt.Errorf("flush frame: %w", err)
	}
	return nil
}

// sync waits until the server consumed everything sent so far and checks
// that both sides agree on the message count and checksum. It returns the
// number of messages verified.
func (c *streamClient) sync() (uint64, error) {
	if err := sendControl(c.st, frameHeader{kind: kindSync, a: c.msgs, b: c.sum}); err != nil {
		return 0, err
	}
	for {
		h, err := c.readControl()
		if err != nil {
			return 0, err
		}
		switch h.kind {
		case kindAck:
			continue
		case kindSyncAck:
		default:
			return 0, fmt.Errorf("unexpected control frame kind %d while waiting for sync ack", h.kind)
		}
		if h.a != c.msgs || h.b != c.sum {
			return 0, fmt.Errorf("checksum mismatch: client sent %d messages with checksum %#x, server consumed %d with checksum %#x",
				c.msgs, c.sum, h.a, h.b)
		}
		n := c.msgs
		c.msgs, c.sum = 0, 0
		c.acked = c.sent
		return n, nil
	}
}

func (c *streamClient) quit() (uint64, error) {
	if err := sendControl(c.st, frameHeader{kind: kindQuit}); err != nil {
		return 0, err
	}
	for {
		h, err := c.readControl()
		if err != nil {
			return 0, err
		}
		switch h.kind {
		case kindAck:
		case kindBye:
			return h.a, nil
		default:
			return 0, fmt.Errorf("unexpected control frame kind %d while waiting for bye", h.kind)
		}
	}
}

func runStream(st *shmipc.Stream, opts options) (*result, uint64, error) {
	spec := opts.spec
	c := &streamClient{
		st:       st,
		msgSize:  spec.msgSize,
		perFrame: spec.msgsPerFrame(opts.batch),
	}
	if opts.copyIn && c.perFrame == 1 {
		c.private = make([]byte, spec.msgSize)
	}
	if opts.window > 0 {
		c.window = uint64(opts.window)
	} else {
		c.window = uint64(min(256, max(2, slicesAvailable(spec, opts.batch, opts.shmCap)/4)))
	}
	c.ackEvery = max(1, c.window/2)
	logf("%s: %d msg(s) of %d B per flush, slice cap %d B, %d slices, window %d flushes, ack every %d",
		spec.name, c.perFrame, c.msgSize, spec.sliceCap(opts.batch), slicesAvailable(spec, opts.batch, opts.shmCap), c.window, c.ackEvery)

	warm := opts.duration / 10
	stop := timer(warm)
	for !stop.Load() {
		if err := c.sendFrame(); err != nil {
			return nil, 0, err
		}
	}
	warmMsgs, err := c.sync()
	if err != nil {
		return nil, 0, err
	}

	stop = timer(opts.duration)
	start := time.Now()
	for !stop.Load() {
		if err := c.sendFrame(); err != nil {
			return nil, 0, err
		}
	}
	msgs, err := c.sync() // includes the time for the server to consume everything
	elapsed := time.Since(start)
	if err != nil {
		return nil, 0, err
	}
	serverErrs, err := c.quit()
	if err != nil {
		return nil, 0, err
	}
	if msgs == 0 {
		return nil, 0, errors.New("no messages sent")
	}
	secs := elapsed.Seconds()
	var value float64
	if spec.unit == "GB/s" {
		value = float64(msgs) * float64(spec.msgSize) / secs / 1e9
	} else {
		value = float64(msgs) / secs
	}
	logf("%s: warm-up %d msgs, measured %d msgs in %v", spec.name, warmMsgs, msgs, elapsed)
	return &result{
		Case:   spec.name,
		Unit:   spec.unit,
		Better: spec.better,
		Value:  value,
		Ops:    msgs,
	}, serverErrs, nil
}
