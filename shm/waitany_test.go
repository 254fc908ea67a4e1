//go:build linux

package shm

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// sleepAnyWords is n futex words in a shared segment, and their values.
func sleepAnyWords(t *testing.T, n int) ([]*atomic.Uint32, []uint32) {
	s := newSegment(t, 4096)
	words := make([]*atomic.Uint32, n)
	vals := make([]uint32, n)
	for i := range words {
		w, err := s.Uint32At(8 * i)
		if err != nil {
			t.Fatal(err)
		}
		w.Store(uint32(7 * i))
		words[i], vals[i] = w, uint32(7*i)
	}
	return words, vals
}

// TestSleepAnyWoken: a sleeper on three words is woken by a Wake of the
// second, its value unchanged (only the wake ends the sleep), and by
// nothing else: Wakes of a word it does not sleep on leave it asleep
// until its d.
func TestSleepAnyWoken(t *testing.T) {
	words, vals := sleepAnyWords(t, 4)
	stop := make(chan struct{})
	waking := make(chan struct{})
	go func() {
		defer close(waking)
		for {
			select {
			case <-stop:
				return
			default:
				Wake(words[3])
				runtime.Gosched()
			}
		}
	}()
	if n := sleeps(t, words[:3], vals[:3], 30*time.Millisecond); n > 3 {
		t.Fatalf("%d sleeps in 30ms: woken by a word it does not sleep on", n)
	}
	close(stop)
	<-waking
	done := make(chan error, 1)
	go func() { done <- SleepAny(words[:3], vals[:3], time.Hour) }()
	deadline := time.After(10 * time.Second)
	for {
		Wake(words[3]) // not slept on
		Wake(words[1]) // until the sleeper is asleep and gets it
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-deadline:
			t.Fatal("a Wake of a word slept on did not end the sleep")
		default:
			runtime.Gosched()
		}
	}
}

// TestSleepAnyValues: a word that no longer holds its value ends the
// sleep at once; unchanged and unwoken, the sleep lasts its d.
func TestSleepAnyValues(t *testing.T) {
	words, vals := sleepAnyWords(t, 3)
	words[2].Add(1)
	done := make(chan error, 1)
	go func() { done <- SleepAny(words, vals, time.Hour) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a changed word did not end the sleep")
	}
	words[2].Add(^uint32(0))
	if n := sleeps(t, words, vals, 30*time.Millisecond); n > 3 {
		t.Fatalf("%d sleeps in 30ms with nothing to end them", n)
	}
}

// sleeps sleeps on words for d, again after each early end (a signal may
// end one), and says how many sleeps it took.
func sleeps(t *testing.T, words []*atomic.Uint32, vals []uint32, d time.Duration) int {
	t.Helper()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		if err := SleepAny(words, vals, time.Until(end)); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func TestSleepAnyArgs(t *testing.T) {
	words, vals := sleepAnyWords(t, 2)
	if err := SleepAny(words, vals[:1], time.Millisecond); err == nil {
		t.Error("fewer values than words accepted")
	}
	if err := SleepAny(nil, nil, time.Millisecond); err == nil {
		t.Error("no words accepted")
	}
	many := make([]*atomic.Uint32, MaxSleepAny+1)
	for i := range many {
		many[i] = words[0]
	}
	if err := SleepAny(many, make([]uint32, len(many)), time.Millisecond); !errors.Is(err, ErrSleepAnyUnsupported) {
		t.Errorf("%d words: %v, want ErrSleepAnyUnsupported", len(many), err)
	}
}
