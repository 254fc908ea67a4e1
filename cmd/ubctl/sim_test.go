package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

func TestSimFaultFlags(t *testing.T) {
	tp, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	// dev4 in fabrics of this test's own: the faults set here must not
	// reach other packages' tests running on dev4 meanwhile.
	mine, other := fmt.Sprintf("simtest-%d", os.Getpid()), fmt.Sprintf("simtest-%d-other", os.Getpid())
	t.Cleanup(func() {
		for _, ns := range []string{mine, other} {
			if f, err := simprov.OpenFabricNamed(tp, ns); err == nil {
				f.Remove()
				f.Close()
			}
		}
	})
	sim := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := simCmd(append([]string{"-topology", "dev4", "-probe=false"}, args...), &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := sim("-fabric", mine, "-link-down", "n0-n1", "-slow", "n2-n3=4", "-crash", "n3")
	for _, want := range []string{`"dev4": 4 nodes, 6 links`, "n0-n1", "down", "4x slower", "UB_NODE=<node>"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Faults in a named fabric stay there.
	if out := sim("-fabric", other); strings.Contains(out, "down") {
		t.Errorf("a fault in fabric %s shows in fabric %s:\n%s", mine, other, out)
	}
	if out := sim("-fabric", mine, "-clear"); strings.Contains(out, "down") || strings.Contains(out, "slower") {
		t.Errorf("faults remain after -clear:\n%s", out)
	}
	for _, bad := range [][]string{{"-topology", "dev4", "-fabric", "../x"}, {"-topology", "dev4", "-link-down", "n0"}, {"-topology", "dev4", "-slow", "n0-n1=x"}, {"-topology", "dev4", "-crash", "nope"}, {"-topology", "/no/such.yaml"}} {
		if err := simCmd(append(bad, "-probe=false"), &bytes.Buffer{}); err == nil {
			t.Errorf("sim %q succeeded", bad)
		}
	}
}
