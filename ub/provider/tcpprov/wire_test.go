package tcpprov

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub"
)

// FuzzFrames feeds arbitrary bytes to the frame readers and decoders a
// hostile peer reaches: they must return errors, never panic, and never
// accept a frame larger than maxFrame.
func FuzzFrames(f *testing.F) {
	req := request{op: opWrite, token: 1, object: 2, offset: 3, payload: []byte("hello")}
	f.Add(req.appendHeader(nil))
	f.Add(append(req.appendHeader(nil), req.payload...))
	f.Add(appendResponse(nil, 0, 7, []byte("x")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, min := range []int{reqHeader, respHeader} {
			frame, err := readFrame(bytes.NewReader(data), nil, min)
			if err != nil {
				continue
			}
			if len(frame) < min || len(frame) > maxFrame {
				t.Fatalf("accepted a frame of %d bytes", len(frame))
			}
			if r, err := decodeRequest(frame); err == nil && (r.op < opWrite || r.op > opFetchAdd) {
				t.Fatalf("accepted op %d", r.op)
			}
			decodeResponse(frame)
		}
	})
}

// TestHostilePeer sends malformed and out-of-range requests to a context's
// listener: the context drops that peer or answers with error statuses, and
// keeps serving others. Its Logger says which peers it dropped and why.
func TestHostilePeer(t *testing.T) {
	log, rec := testenv.NewLogRecorder()
	c, err := ub.Open(context.Background(), Name, ub.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seg, err := c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessAtomic, Token: 9})
	if err != nil {
		t.Fatal(err)
	}
	addr := c.(*Context).Addr()
	_, id, _ := parseName(seg.Desc().Name, "s")

	exchange := func(frame []byte) (response, error) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(500 * time.Millisecond))
		nc.Write(frame)
		b, err := readFrame(nc, nil, respHeader)
		if err != nil {
			return response{}, err
		}
		return decodeResponse(b)
	}
	// Garbage: the peer is dropped (no answer), nothing else happens.
	for _, junk := range [][]byte{{1, 2, 3}, {0xff, 0xff, 0xff, 0x7f, 1}, binary.LittleEndian.AppendUint32(nil, 10)} {
		if _, err := exchange(junk); err == nil {
			t.Errorf("garbage %x got an answer", junk)
		}
	}
	unknown := request{op: 99}
	if _, err := exchange(unknown.appendHeader(nil)); err == nil {
		t.Error("an unknown op got an answer")
	}
	rec.WaitFor(t, "level=WARN", "tcpprov: dropped a peer: a request that does not decode")
	// Well-formed requests that ask for the impossible get statuses.
	for _, tc := range []struct {
		req  request
		want ub.Status
	}{
		{request{op: opRead, token: 9, object: id, offset: 4090, n: 100}, ub.StatusOutOfBounds},
		{request{op: opRead, token: 9, object: id, offset: 1 << 62, n: 1}, ub.StatusOutOfBounds},
		{request{op: opRead, token: 8, object: id, n: 1}, ub.StatusBadToken},
		{request{op: opRead, token: 9, object: id + 100, n: 1}, ub.StatusNoPermission},
		{request{op: opFetchAdd, token: 9, object: id, offset: 4}, ub.StatusMisaligned},
		{request{op: opSend, token: 9, object: 12345}, ub.StatusFlushed},
	} {
		resp, err := exchange(append(tc.req.appendHeader(nil), tc.req.payload...))
		if err != nil {
			t.Fatalf("%+v: %v", tc.req, err)
		}
		if ub.Status(resp.status) != tc.want {
			t.Errorf("%+v: status %v, want %v", tc.req, ub.Status(resp.status), tc.want)
		}
	}
	rec.WaitFor(t, "level=DEBUG", "tcpprov: denied a request", "status=")
	// And the context still serves a normal read.
	copy(seg.Bytes(), "still here")
	resp, err := exchange((&request{op: opRead, token: 9, object: id, n: 10}).appendHeader(nil))
	if err != nil || string(resp.payload) != "still here" {
		t.Fatalf("normal read after the hostile ones: %q %v", resp.payload, err)
	}
}
