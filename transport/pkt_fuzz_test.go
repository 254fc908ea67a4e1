package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func packet(kind byte, p []byte) []byte {
	b := []byte{kind, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[1:], uint32(len(p)))
	return append(b, p...)
}

// FuzzPackets feeds a connection on the tcp path whatever a hostile peer
// might send: it must give errors, never panic or hang, and hand over
// nothing that was not sent whole.
func FuzzPackets(f *testing.F) {
	msg := binary.LittleEndian.AppendUint64(nil, 5)
	f.Add(packet(pkData, []byte("hello")))
	f.Add(append(packet(pkMsgFirst, append(msg, "he"...)), packet(pkMsgMore, []byte("llo"))...))
	f.Add(append(packet(pkEOF, nil), packet(pkData, []byte("late"))...))
	f.Add(packet(pkMsgMore, []byte("orphan")))
	f.Add(packet(pkMsgFirst, binary.LittleEndian.AppendUint64(nil, 1<<62)))
	f.Add(packet(pkClose, nil))
	f.Add([]byte{pkData, 0xff, 0xff, 0xff, 0xff})
	f.Add(packet(9, nil))
	win := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1<<20), 1<<20)
	f.Add(append(packet(pkWindow, win), packet(pkWindow, win)...))
	f.Add(packet(pkCredit, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1<<63), 1)))
	f.Add(packet(pkBlocked, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1), 1<<40)))
	f.Add(packet(pkCredit, []byte{1, 2, 3}))
	f.Fuzz(func(t *testing.T, wire []byte) {
		a, b := net.Pipe()
		c := newPktConn(newTCPLink(a), Addr{}, Addr{}, nil)
		go func() {
			b.Write(wire)
			b.Close()
		}()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		if len(got) > len(wire) {
			t.Fatalf("read %d bytes from %d on the wire", len(got), len(wire))
		}
		_ = err
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for {
			m, err := c.Recv(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("Recv hung on a finished wire")
			}
			if err != nil {
				break
			}
			if len(m.Bytes()) > len(wire) {
				t.Fatalf("a message of %d bytes from %d on the wire", len(m.Bytes()), len(wire))
			}
			m.Release()
		}
		cancel()
		b.Close() // the peer is gone: Close has nobody to say goodbye to
		c.Close()
	})
}
