package shm

import (
	"errors"
	"testing"
)

// TestPoolReclaimInterrupted: a buffer a Reclaim left half taken back (its
// process died between the owner swap and the state swap: in use, owner 0)
// is taken back by the next Reclaim instead of staying in use for good.
func TestPoolReclaimInterrupted(t *testing.T) {
	_, p := newPool(t, PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}})
	b, err := p.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	atomicU64(p.desc(b.class, b.idx), descOffOwner).Store(0)
	if n := p.Reclaim(); n != 1 {
		t.Fatalf("Reclaim took back %d buffers, want the half reclaimed one", n)
	}
	if err := b.Return(); !errors.Is(err, ErrStaleHandle) {
		t.Errorf("the dead loan's handle: %v, want stale", err)
	}
	if _, err := p.Loan(64); err != nil {
		t.Fatalf("loan after the reclaim: %v", err)
	}
}

// TestPoolReturnAfterClose: a buffer returned through an attachment after
// its Close goes to the shared list, where other attachments find it,
// not to a local cache nobody will empty.
func TestPoolReturnAfterClose(t *testing.T) {
	seg, p := newPool(t, PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}})
	b, err := p.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := b.Return(); err != nil {
		t.Fatal(err)
	}
	other, err := OpenPool(seg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Loan(64); err != nil {
		t.Fatalf("loan of the buffer returned after Close: %v", err)
	}
}
