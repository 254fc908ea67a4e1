package transportsuite

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// rawCodec moves payloads through gRPC without copying or allocating
// them: the client fills a buffer from gRPC's own pool and hands it over
// (gRPC frees it once sent), and the server checksums the received buffers
// in place. Every contender runs the same codec, so what differs between
// them is the connection.
type rawCodec struct{}

// payload is a message: a pooled buffer going out, or what came in.
type payload struct {
	out mem.Buffer
	// Received: the byte count and checksum of a message, or the raw
	// bytes of a small one (the server's answer).
	n, sum uint64
	raw    []byte
}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	p := v.(*payload)
	if p.out != nil {
		b := p.out
		p.out = nil
		return mem.BufferSlice{b}, nil
	}
	return mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), p.raw...))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p := v.(*payload)
	var s bench.Summer
	p.n, p.raw = 0, p.raw[:0]
	for _, b := range data {
		d := b.ReadOnlyData()
		s.Write(d)
		p.n += uint64(len(d))
		if data.Len() <= 64 {
			p.raw = append(p.raw, d...)
		}
	}
	p.sum = s.Sum()
	return nil
}

func (rawCodec) Name() string { return "ubkit-raw" }

// sinkService is a client-streaming method: it sums every byte of every
// message and answers with the count and the sum.
var sinkService = grpc.ServiceDesc{
	ServiceName: "ubkit.bench.Pump",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Sink",
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			var n, sum uint64
			var msg payload
			for {
				if err := stream.RecvMsg(&msg); err == io.EOF {
					break
				} else if err != nil {
					return err
				}
				n += msg.n
				sum += msg.sum
			}
			res := binary.LittleEndian.AppendUint64(nil, n)
			res = binary.LittleEndian.AppendUint64(res, sum)
			return stream.SendMsg(&payload{raw: res})
		},
	}},
}

func newStreamServer(kind string) *grpc.Server {
	srv := grpc.NewServer(append(serverOptions(kind), grpc.ForceServerCodecV2(rawCodec{}), grpc.MaxRecvMsgSize(4<<20))...)
	srv.RegisterService(&sinkService, struct{}{})
	return srv
}

// warmupMsgs is how many messages open each run, untimed.
const warmupMsgs = 32

// grpcStream sends 1 MiB messages on one client stream for d.
func grpcStream(kind string, d time.Duration) (bench.Measurement, error) {
	cc, stop, err := grpcTo(kind, "grpc-stream")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &sinkService.Streams[0], "/ubkit.bench.Pump/Sink", grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return bench.Measurement{}, err
	}
	const size = 1 << 20
	pool := mem.DefaultBufferPool()
	var n, sum uint64
	send := func(i uint64) error {
		buf := pool.Get(size)
		bench.Fill(*buf, i)
		sum += bench.FillSum(size, i)
		n += size
		return cs.SendMsg(&payload{out: mem.NewBuffer(buf, pool)})
	}
	// Warm the stream up first, untimed: a run's first messages fill the
	// windows and gRPC's buffer pools, so its first milliseconds measure
	// that, not the connection.
	var i uint64
	for ; i < warmupMsgs; i++ {
		if err := send(i); err != nil {
			return bench.Measurement{}, err
		}
	}
	warm := n
	start := time.Now()
	for ; time.Since(start) < d; i++ {
		if err := send(i); err != nil {
			return bench.Measurement{}, err
		}
	}
	if err := cs.CloseSend(); err != nil {
		return bench.Measurement{}, err
	}
	var got payload
	if err := cs.RecvMsg(&got); err != nil {
		return bench.Measurement{}, err
	}
	res := got.raw
	el := time.Since(start)
	if len(res) != 16 || binary.LittleEndian.Uint64(res) != n || binary.LittleEndian.Uint64(res[8:]) != sum {
		return bench.Measurement{}, fmt.Errorf("the server got different bytes")
	}
	// The answer comes once the server has read everything. Only what was
	// sent after the clock started counts; what the warm-up still had in
	// flight then (gRPC's windows, a few MiB) is read in the timed part
	// without being counted, which errs low for every contender.
	return bench.Measurement{Value: float64(n-warm) / el.Seconds() / 1e9}, nil
}
