package transportsuite

import (
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	dir, err := os.MkdirTemp("", "ubkit-transportsuite-")
	if err != nil {
		panic(err)
	}
	os.Setenv("UBKIT_RUNTIME_DIR", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestCasesRun runs every contender briefly across processes.
func TestCasesRun(t *testing.T) {
	for _, c := range Cases() {
		for _, k := range c.Contenders {
			t.Run(c.Name+"/"+k.Name, func(t *testing.T) {
				m, err := k.Run(30 * time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				if m.Value <= 0 {
					t.Fatalf("value %v", m.Value)
				}
			})
		}
	}
}
