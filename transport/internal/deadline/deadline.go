// Package deadline is a settable deadline whose channel closes when it passes,
// for connections that must wake a blocked Read or Write when a deadline moves.
package deadline

import (
	"sync"
	"time"
)

// Deadline is a settable deadline whose channel closes when it passes. A
// waiter holds the channel; moving the deadline into the past closes it,
// which wakes the waiter.
type Deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{}
}

// New returns a deadline that is not set.
func New() *Deadline { return &Deadline{ch: make(chan struct{})} }

// Set moves the deadline; the zero time clears it.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for it to have closed the channel
	}
	d.timer = nil
	closed := IsClosed(d.ch)
	if t.IsZero() {
		if closed {
			d.ch = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.ch = make(chan struct{})
		}
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.ch)
	}
}

// Wait returns the channel that closes when the deadline passes.
func (d *Deadline) Wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// IsClosed reports whether c is closed.
func IsClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
