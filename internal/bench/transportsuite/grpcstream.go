package transportsuite

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// rawCodec passes []byte messages through gRPC unchanged, so the streaming
// case needs no generated code.
type rawCodec struct{}

// Marshal copies: gRPC may still be sending the bytes after SendMsg
// returns, while the caller refills its buffer.
func (rawCodec) Marshal(v any) ([]byte, error) { return append([]byte(nil), *v.(*[]byte)...), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
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
			var msg []byte
			for {
				if err := stream.RecvMsg(&msg); err == io.EOF {
					break
				} else if err != nil {
					return err
				}
				n += uint64(len(msg))
				sum += bench.Sum(msg)
			}
			res := binary.LittleEndian.AppendUint64(nil, n)
			res = binary.LittleEndian.AppendUint64(res, sum)
			return stream.SendMsg(&res)
		},
	}},
}

func newStreamServer() *grpc.Server {
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(4<<20))
	srv.RegisterService(&sinkService, struct{}{})
	return srv
}

// grpcStream sends 1 MiB messages on one client stream for d.
func grpcStream(kind string, d time.Duration) (bench.Measurement, error) {
	cc, stop, err := grpcTo(kind, "grpc-stream")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &sinkService.Streams[0], "/ubkit.bench.Pump/Sink", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return bench.Measurement{}, err
	}
	msg := make([]byte, 1<<20)
	var n, sum uint64
	start := time.Now()
	for i := uint64(0); time.Since(start) < d; i++ {
		bench.Fill(msg, i)
		sum += bench.FillSum(len(msg), i)
		if err := cs.SendMsg(&msg); err != nil {
			return bench.Measurement{}, err
		}
		n += uint64(len(msg))
	}
	if err := cs.CloseSend(); err != nil {
		return bench.Measurement{}, err
	}
	var res []byte
	if err := cs.RecvMsg(&res); err != nil {
		return bench.Measurement{}, err
	}
	el := time.Since(start)
	if len(res) != 16 || binary.LittleEndian.Uint64(res) != n || binary.LittleEndian.Uint64(res[8:]) != sum {
		return bench.Measurement{}, fmt.Errorf("the server got different bytes")
	}
	return bench.Measurement{Value: float64(n) / el.Seconds() / 1e9}, nil
}
