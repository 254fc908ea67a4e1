package shmprov

import (
	"context"
	"testing"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// TestForgedReceiveName: a receiver that posts a "receive" naming another
// context's segment must not get the sender to write there.
func TestForgedReceiveName(t *testing.T) {
	open := func() ub.Context {
		c, err := ub.Open(context.Background(), Name, ub.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	victim, rx, tx := open(), open(), open()
	secret, _ := victim.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessLocal, Token: 99})
	copy(secret.Bytes(), "SECRET..")
	rq, _ := rx.NewCQ(ub.CQConfig{})
	rj, _ := rx.NewJetty(ub.JettyConfig{SendCQ: rq, RecvCQ: rq})

	js, err := shm.OpenSegment(rj.Desc().Name)
	if err != nil {
		t.Fatal(err)
	}
	defer js.Close()
	recvOff, _, _ := jettyLayout(defaultRecvDepth)
	ring, err := shm.OpenMPMC(js, recvOff, shm.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	slot := make([]byte, recvSlotSize)
	postedRecv{name: []byte(secret.Desc().Name), off: segHeader, len: 64}.encode(slot)
	if err := ring.TryPush(slot); err != nil {
		t.Fatal(err)
	}

	q, _ := tx.NewCQ(ub.CQConfig{})
	j, _ := tx.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	loc, _ := tx.AllocSegment(4096, ub.SegmentConfig{})
	copy(loc.Bytes(), "PWNED!!!")
	tg, err := tx.ImportJetty(rj.Desc(), 0)
	if err != nil {
		t.Fatal(err)
	}
	j.PostSend([]ub.WR{{Op: ub.OpSend, Local: ub.Local{Seg: loc, Len: 8}, Target: tg}})
	out := make([]ub.Completion, 1)
	if n, _ := q.Poll(out); n != 1 || out[0].Status != ub.StatusRemoteLength {
		t.Errorf("send into a forged receive: %+v", out[:n])
	}
	if string(secret.Bytes()[:8]) != "SECRET.." {
		t.Fatalf("another context's segment was written: %q", secret.Bytes()[:8])
	}
}
