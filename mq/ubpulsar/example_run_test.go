package ubpulsar

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// testExample runs examples/pulsar-offload against the test broker: it
// must print all 8 results with their checksums verified.
func testExample(t *testing.T, b *testenv.Pulsar) {
	cmd := exec.Command("go", "run", "./examples/pulsar-offload")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "PULSAR_URL="+b.ServiceURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if n := strings.Count(string(out), "1048576 bytes, checksum ok"); n != 8 {
		t.Fatalf("%d results of 8:\n%s", n, out)
	}
}
