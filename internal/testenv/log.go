package testenv

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogGuard bounds LogRecorder.WaitFor's wait: a line that is not logged
// by then is not coming.
const LogGuard = 10 * time.Second

// LogRecorder keeps the lines a component logs, for tests of what it says
// and at which level. Its Logger logs everything, Debug included, as
// slog's text handler formats it.
type LogRecorder struct {
	mu    sync.Mutex
	lines []string
	added chan struct{} // closed, and replaced, when a line is added
}

// NewLogRecorder returns a logger and the recorder of what it logs.
func NewLogRecorder() (*slog.Logger, *LogRecorder) {
	r := &LogRecorder{added: make(chan struct{})}
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug})), r
}

// Write takes one line from the text handler, which writes each record
// with one call.
func (r *LogRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, strings.TrimSuffix(string(p), "\n"))
	close(r.added)
	r.added = make(chan struct{})
	return len(p), nil
}

// Lines returns the lines logged so far.
func (r *LogRecorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// WaitFor waits until a line containing every one of parts is logged, and
// returns it. It fails the test after LogGuard, listing what was logged.
func (r *LogRecorder) WaitFor(t testing.TB, parts ...string) string {
	t.Helper()
	guard := time.NewTimer(LogGuard)
	defer guard.Stop()
	for {
		r.mu.Lock()
		for _, l := range r.lines {
			if containsAll(l, parts) {
				r.mu.Unlock()
				return l
			}
		}
		added := r.added
		r.mu.Unlock()
		select {
		case <-added:
		case <-guard.C:
			t.Fatalf("no line with %q was logged in %v; logged:\n%s", parts, LogGuard, strings.Join(r.Lines(), "\n"))
			return ""
		}
	}
}
