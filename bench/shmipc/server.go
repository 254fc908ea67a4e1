package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	shmipc "github.com/cloudwego/shmipc-go"
)

// serverMain is the entry point of the re-executed server process.
func serverMain() int {
	verbose = os.Getenv(envVerb) == "true"
	if err := serve(); err != nil {
		fmt.Fprintf(os.Stderr, "shmipc-bench server: %v\n", err)
		return 1
	}
	return 0
}

func serve() error {
	sock := os.Getenv(envSock)
	spec, ok := cases[os.Getenv(envCase)]
	if sock == "" || !ok {
		return errors.New("missing or invalid " + envSock + "/" + envCase)
	}
	batch, err := strconv.Atoi(os.Getenv(envBatch))
	if err != nil || batch < 1 {
		return fmt.Errorf("invalid %s", envBatch)
	}
	shmCap, err := strconv.ParseUint(os.Getenv(envShmCap), 10, 32)
	if err != nil {
		return fmt.Errorf("invalid %s", envShmCap)
	}

	// Watchdog: stdin is a pipe whose write end only the parent holds; EOF
	// means the parent died, so do not linger.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Fprintln(os.Stderr, "shmipc-bench server: parent process went away, exiting")
		os.Exit(3)
	}()

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	defer ln.Close() // also unlinks the socket file
	if _, err := fmt.Fprintln(resultOut, readyLine); err != nil {
		return fmt.Errorf("report readiness: %w", err)
	}
	resultOut.Close()

	if err := ln.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	conn, err := ln.AcceptUnix()
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	ln.Close()

	// The server maps whatever the client created (the client's config
	// decides sizes and memory type); this config only has to be valid.
	conf := newConfig(spec, batch, uint32(shmCap), false, os.TempDir()+"/shmipc-bench-server-unused")
	sess, err := shmipc.Server(conn, conf)
	if err != nil {
		return fmt.Errorf("create shmipc server session: %w", err)
	}
	defer sess.Close()

	acceptTimer := time.AfterFunc(30*time.Second, func() { sess.Close() })
	st, err := sess.AcceptStream()
	acceptTimer.Stop()
	if err != nil {
		return fmt.Errorf("accept stream: %w", err)
	}

	if spec.pingpong {
		err = servePingpong(sess, st)
	} else {
		err = serveStream(sess, st, spec)
	}
	if err != nil {
		return err
	}
	_, stab, _ := sess.GetMetrics()
	logf("server metrics: %+v", stab)

	// Let the client close the session first (it owns the shared memory).
	select {
	case <-sess.CloseChan():
	case <-time.After(10 * time.Second):
	}
	return nil
}

func serverErrCounters(sess *shmipc.Session) uint64 {
	_, stab, _ := sess.GetMetrics()
	return stab.FallbackWriteCount + stab.AllocShmErrorCount + stab.QueueFullErrorCount + stab.FallbackReadCount
}

// servePingpong answers 64-byte requests with 64-byte replies until the quit
// request. Every request byte is read (summed) and every reply byte written.
func servePingpong(sess *shmipc.Session, st *shmipc.Stream) error {
	var n, total uint64
	for {
		q, err := st.BufferReader().ReadBytes(msgSize64)
		if err != nil {
			return fmt.Errorf("read request %d: %w", n, err)
		}
		w0 := binary.LittleEndian.Uint64(q[0:8])
		s := sumWords(q)
		// Release the request and write the reply into the same shm slice.
		st.ReleaseReadAndReuse()
		p, err := st.BufferWriter().Reserve(msgSize64)
		if err != nil {
			return fmt.Errorf("reserve reply: %w", err)
		}
		_ = p[63]
		if w0 == quitWord {
			binary.LittleEndian.PutUint64(p[0:8], n)
			binary.LittleEndian.PutUint64(p[8:16], total)
			binary.LittleEndian.PutUint64(p[16:24], serverErrCounters(sess))
			for i := 24; i < msgSize64; i += 8 {
				binary.LittleEndian.PutUint64(p[i:i+8], 0)
			}
			if err := st.Flush(false); err != nil {
				return fmt.Errorf("flush quit reply: %w", err)
			}
			return nil
		}
		n++
		total += s
		binary.LittleEndian.PutUint64(p[0:8], s)
		binary.LittleEndian.PutUint64(p[8:16], s+1)
		binary.LittleEndian.PutUint64(p[16:24], s+2)
		binary.LittleEndian.PutUint64(p[24:32], s+3)
		binary.LittleEndian.PutUint64(p[32:40], s+4)
		binary.LittleEndian.PutUint64(p[40:48], s+5)
		binary.LittleEndian.PutUint64(p[48:56], s+6)
		binary.LittleEndian.PutUint64(p[56:64], s+7)
		if err := st.Flush(false); err != nil {
			return fmt.Errorf("flush reply: %w", err)
		}
	}
}

// serveStream consumes data frames, reading and summing every payload byte,
// acks when asked, and answers sync and quit frames.
func serveStream(sess *shmipc.Session, st *shmipc.Stream, spec caseSpec) error {
	r := st.BufferReader()
	var msgs, sum uint64
	var mismatch error
	for {
		h, err := readHeader(st)
		if err != nil {
			return fmt.Errorf("read frame header: %w", err)
		}
		switch h.kind {
		case kindData:
			if h.count == 0 || h.count > 1<<16 {
				return fmt.Errorf("bad data frame count %d", h.count)
			}
			for i := uint32(0); i < h.count; i++ {
				m, err := r.ReadBytes(spec.msgSize)
				if err != nil {
					return fmt.Errorf("read message: %w", err)
				}
				sum += sumWords(m)
			}
			msgs += uint64(h.count)
			r.ReleasePreviousRead()
			if h.flags&flagAckReq != 0 {
				if err := sendControl(st, frameHeader{kind: kindAck, a: h.a}); err != nil {
					return err
				}
			}
		case kindSync:
			r.ReleasePreviousRead()
			if (h.a != msgs || h.b != sum) && mismatch == nil {
				mismatch = fmt.Errorf("checksum mismatch: client sent %d messages with checksum %#x, server consumed %d with checksum %#x",
					h.a, h.b, msgs, sum)
			}
			if err := sendControl(st, frameHeader{kind: kindSyncAck, a: msgs, b: sum}); err != nil {
				return err
			}
			msgs, sum = 0, 0
		case kindQuit:
			r.ReleasePreviousRead()
			if err := sendControl(st, frameHeader{kind: kindBye, a: serverErrCounters(sess)}); err != nil {
				return err
			}
			return mismatch
		default:
			return fmt.Errorf("unknown frame kind %d", h.kind)
		}
	}
}
