package ubsuite

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// The tcp baseline does what a one-sided Write over the tcp provider does on
// the wire, with nothing else: send a message of size bytes, the peer reads
// (and sums) it and answers with a 16-byte acknowledgement.

func init() {
	bench.RegisterPeer("tcp-ack", func(json.RawMessage) error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		fmt.Println(l.Addr())
		nc, err := l.Accept()
		if err != nil {
			return err
		}
		defer nc.Close()
		nc.(*net.TCPConn).SetNoDelay(true)
		r := bufio.NewReaderSize(nc, 64<<10)
		var hdr [4]byte
		var ack [16]byte
		buf := make([]byte, mib)
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			n := binary.LittleEndian.Uint32(hdr[:])
			if n > mib {
				return fmt.Errorf("message of %d bytes", n)
			}
			if _, err := io.ReadFull(r, buf[:n]); err != nil {
				return err
			}
			binary.LittleEndian.PutUint64(ack[:], bench.Sum(buf[:n]))
			if _, err := nc.Write(ack[:]); err != nil {
				return err
			}
		}
	})
}

func tcpAck(d time.Duration, size int) (bench.Measurement, error) {
	peer, err := bench.StartPeerPipe("tcp-ack", nil)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	addr, err := bufio.NewReader(peer.Stdout()).ReadString('\n')
	if err != nil {
		return bench.Measurement{}, fmt.Errorf("tcp-ack peer: %w", err)
	}
	nc, err := net.Dial("tcp", strings.TrimSpace(addr))
	if err != nil {
		return bench.Measurement{}, err
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetNoDelay(true)
	msg := make([]byte, 4+size)
	binary.LittleEndian.PutUint32(msg, uint32(size))
	var ack [16]byte
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 16 {
			bench.Fill(msg[4:], uint64(n))
			if _, err := nc.Write(msg); err != nil {
				return bench.Measurement{}, err
			}
			if _, err := io.ReadFull(nc, ack[:]); err != nil {
				return bench.Measurement{}, err
			}
			if got, want := binary.LittleEndian.Uint64(ack[:]), bench.FillSum(size, uint64(n)); got != want {
				return bench.Measurement{}, fmt.Errorf("ack checksum %x, want %x", got, want)
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
