package mqsuite

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq/offload"
)

// harness lets a benchmark start testenv's brokers, whose API takes a
// testing.TB: it records Cleanup functions (run by close) and turns
// Fatal into an error. Only the methods below are called by
// StartPulsar and StartRocketMQ; the embedded TB is nil.
type harness struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	err      error
}

func (h *harness) Helper()      {}
func (h *harness) Name() string { return "ubctl-bench-mq" }
func (h *harness) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}
func (h *harness) fail(err error) {
	h.mu.Lock()
	h.err = errors.Join(h.err, err)
	h.mu.Unlock()
}
func (h *harness) Errorf(format string, args ...any) { h.fail(fmt.Errorf(format, args...)) }
func (h *harness) Fatalf(format string, args ...any) {
	h.fail(fmt.Errorf(format, args...))
	runtime.Goexit()
}
func (h *harness) Fatal(args ...any) {
	h.fail(errors.New(fmt.Sprint(args...)))
	runtime.Goexit()
}
func (h *harness) Logf(string, ...any) {}
func (h *harness) Log(...any)          {}
func (h *harness) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err != nil
}

// close runs the cleanups, newest first.
func (h *harness) close() {
	h.mu.Lock()
	fs := slices.Clone(h.cleanups)
	h.cleanups = nil
	h.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}

// start runs f (a broker start) on its own goroutine, so that a Fatal
// ends only it, and returns its result or the failure.
func start[T any](h *harness, f func(testing.TB) T) (T, error) {
	var v T
	done := make(chan struct{})
	go func() {
		defer close(done)
		v = f(h)
	}()
	<-done
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		var zero T
		return zero, h.err
	}
	return v, nil
}

// Brokers starts Pulsar and RocketMQ for the offload cases on first use
// and keeps them for every run; Close stops them.
type Brokers struct {
	hp, hr      harness // one per broker: a failure of one is not the other's
	pulsarOnce  sync.Once
	pulsar      *testenv.Pulsar
	pulsarErr   error
	rocketOnce  sync.Once
	rocketmq    *testenv.RocketMQ
	rocketmqErr error
	// quick: no waiting for a started broker to settle (tests, which
	// check that the cases run, not what they measure).
	quick bool
	// The offload cases' store, opened by the first run that needs it
	// and kept for the suite (offload.go, store).
	storeOnce   sync.Once
	store       *offload.Store
	storeErr    error
	removeStore func()
}

// NewBrokers returns brokers started as the cases need them, each waited
// for until its start-up work is over (settle).
func NewBrokers() *Brokers { return &Brokers{} }

// Close stops the brokers started and removes the offload store.
func (b *Brokers) Close() {
	b.hp.close()
	b.hr.close()
	if b.removeStore != nil {
		b.removeStore()
	}
}

// Pulsar returns the suite's Pulsar standalone.
func (b *Brokers) Pulsar() (*testenv.Pulsar, error) {
	b.pulsarOnce.Do(func() {
		b.pulsar, b.pulsarErr = start(&b.hp, func(t testing.TB) *testenv.Pulsar { return testenv.StartPulsar(t, testenv.BrokerOptions{}) })
		if b.pulsarErr == nil && !b.quick {
			settle(os.Stderr, "Pulsar", b.pulsar.Pid())
		}
	})
	return b.pulsar, b.pulsarErr
}

// RocketMQ returns the suite's RocketMQ name server and broker.
func (b *Brokers) RocketMQ() (*testenv.RocketMQ, error) {
	b.rocketOnce.Do(func() {
		b.rocketmq, b.rocketmqErr = start(&b.hr, func(t testing.TB) *testenv.RocketMQ { return testenv.StartRocketMQ(t, testenv.BrokerOptions{}) })
		if b.rocketmqErr == nil && !b.quick {
			namesrv, broker := b.rocketmq.Pids()
			settle(os.Stderr, "RocketMQ", namesrv, broker)
		}
	})
	return b.rocketmq, b.rocketmqErr
}

// A broker is settled once its processes used less than settleQuiet of a
// CPU in each of settleRuns consecutive windows of settleWindow; it is
// waited for settleMax at most.
const (
	settleWindow = time.Second
	settleQuiet  = 0.25
	settleRuns   = 2
	settleMax    = 90 * time.Second
)

// settle waits until a broker that has just said it is ready has also
// finished its start-up work, so that no contender's rounds run beside
// it. On this 2-vCPU machine a RocketMQ 5.5.0 broker takes more than a
// whole CPU for about 10 s after "boot success" (its JIT compilers, and
// TransactionMetricsFlushService, whose thread, TransactionFlushService,
// loops without waiting until its first flush and after a failed one),
// then about 10% of one; rounds run in that time
// measured the start-up rather than the path (docs/PERFORMANCE.md, "The
// broker's start-up under the first rounds"). It tells w what it waits
// for and how it ended; a broker that does not settle is used anyway,
// and w is told so.
func settle(w io.Writer, name string, pids ...int) {
	cpu := func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range pids {
			d, err := procstat.CPU(pid)
			if err != nil {
				return 0, err
			}
			sum += d
		}
		return sum, nil
	}
	start := time.Now()
	lastAt := start
	last, err := cpu()
	if err != nil {
		fmt.Fprintf(w, "mq bench: %s's CPU time: %v (not waiting for its start-up work to end)\n", name, err)
		return
	}
	tick := time.NewTicker(settleWindow)
	defer tick.Stop()
	quiet, told := 0, false
	var share float64
	for quiet < settleRuns {
		<-tick.C
		now, err := cpu()
		at := time.Now()
		if err != nil {
			fmt.Fprintf(w, "mq bench: %s's CPU time: %v (not waiting for its start-up work to end)\n", name, err)
			return
		}
		// Over the time that passed, which a late tick makes longer.
		share = float64(now-last) / float64(at.Sub(lastAt))
		last, lastAt = now, at
		if share < settleQuiet {
			quiet++
			continue
		}
		quiet = 0
		if !told {
			fmt.Fprintf(w, "mq bench: %s is ready but still at %.0f%% of a CPU (start-up work); waiting for it to settle below %.0f%%\n", name, 100*share, 100*settleQuiet)
			told = true
		}
		if at.Sub(start) > settleMax {
			fmt.Fprintf(w, "mq bench: %s still at %.0f%% of a CPU after %v; measuring anyway, beside it\n", name, 100*share, settleMax)
			return
		}
	}
	if told {
		fmt.Fprintf(w, "mq bench: %s settled after %.0f s (%.0f%% of a CPU)\n", name, time.Since(start).Seconds(), 100*share)
	}
}
