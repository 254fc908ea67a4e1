package mqsuite

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
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
}

// NewBrokers returns brokers started as the cases need them.
func NewBrokers() *Brokers { return &Brokers{} }

// Close stops the brokers started.
func (b *Brokers) Close() { b.hp.close(); b.hr.close() }

// Pulsar returns the suite's Pulsar standalone.
func (b *Brokers) Pulsar() (*testenv.Pulsar, error) {
	b.pulsarOnce.Do(func() {
		b.pulsar, b.pulsarErr = start(&b.hp, func(t testing.TB) *testenv.Pulsar { return testenv.StartPulsar(t, testenv.BrokerOptions{}) })
	})
	return b.pulsar, b.pulsarErr
}

// RocketMQ returns the suite's RocketMQ name server and broker.
func (b *Brokers) RocketMQ() (*testenv.RocketMQ, error) {
	b.rocketOnce.Do(func() {
		b.rocketmq, b.rocketmqErr = start(&b.hr, func(t testing.TB) *testenv.RocketMQ { return testenv.StartRocketMQ(t, testenv.BrokerOptions{}) })
	})
	return b.rocketmq, b.rocketmqErr
}
