package mqsuite

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// lineWriter hands each line written to it to on.
type lineWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	on  func(line string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.on(strings.TrimSuffix(line, "\n"))
	}
}

// TestSettle: settle waits while the processes it watches compute and
// returns once they stop, saying both; it returns at once, silently, for
// processes that do nothing, and tells why it cannot watch a process
// that is gone.
func TestSettle(t *testing.T) {
	start := func(script string) int {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}

	t.Run("busy, then quiet", func(t *testing.T) {
		stop := filepath.Join(t.TempDir(), "stop")
		spin := "while [ ! -e " + stop + " ]; do :; done; exec sleep 600"
		a := start(spin)
		var lines []string
		w := &lineWriter{on: func(line string) {
			lines = append(lines, line)
			if strings.Contains(line, "waiting for it to settle") {
				if err := os.WriteFile(stop, nil, 0o600); err != nil {
					t.Error(err)
				}
			}
		}}
		settle(w, "the spinner", a, start("exec sleep 600"))
		if len(lines) != 2 || !strings.Contains(lines[0], "the spinner is ready but still at") || !strings.Contains(lines[1], "the spinner settled after") {
			t.Fatalf("settle said %q", lines)
		}
		if _, err := os.Stat(stop); err != nil {
			t.Fatalf("settle returned before the spinner was told to stop: %v", err)
		}
	})

	t.Run("quiet", func(t *testing.T) {
		var out bytes.Buffer
		settle(&out, "sleep", start("exec sleep 600"))
		if out.Len() != 0 {
			t.Fatalf("settle said %q of an idle process", out.String())
		}
	})

	t.Run("gone", func(t *testing.T) {
		cmd := exec.Command("true")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		settle(&out, "true", cmd.Process.Pid)
		if !strings.Contains(out.String(), "true's CPU time") || !strings.Contains(out.String(), "not waiting") {
			t.Fatalf("settle said %q of a process that is gone", out.String())
		}
	})
}
