package ubrocketmq

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// testExample runs examples/rocketmq-offload against the test broker: it
// must print all 8 results with their checksums verified.
func testExample(t *testing.T, b *testenv.RocketMQ) {
	createTopic(t, b, "inference-results", 1)
	cmd := exec.Command("go", "run", "./examples/rocketmq-offload")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "ROCKETMQ_NAMESRV="+b.NamesrvAddr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if n := strings.Count(string(out), "1048576 bytes, checksum ok"); n != 8 {
		t.Fatalf("%d results of 8:\n%s", n, out)
	}
}
