package discovery

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub/topology"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture unpacks testdata/<name>.txtar (a comment, then "-- path --"
// lines each followed by that file's content) into a new root directory.
// The trees are archives rather than directories because real sysfs names
// (0000:07:00.0) are not allowed in a Go module's files.
func fixture(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name+".txtar"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var file string
	var content bytes.Buffer
	flush := func() {
		if file == "" {
			return
		}
		p := filepath.Join(root, filepath.FromSlash(file))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		content.Reset()
	}
	for line := range strings.Lines(string(data)) {
		if name, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "-- "); ok && strings.HasSuffix(name, " --") {
			flush()
			file = strings.TrimSuffix(name, " --")
			continue
		}
		if file != "" {
			content.WriteString(line)
		}
	}
	flush()
	return root
}

// dev4 is the identity the scans of these tests use: node n1 of the dev4
// example super node.
func dev4(t testing.TB) *topology.Topology {
	t.Helper()
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	return topo
}
