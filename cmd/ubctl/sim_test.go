package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

func TestSimFaultFlags(t *testing.T) {
	// dev4 under a name of its own: the faults set here must not reach
	// other packages' tests running on dev4 meanwhile.
	topo, name, err := testenv.PrivateTopology(t.TempDir(), "dev4")
	if err != nil {
		t.Fatal(err)
	}
	tp, err := topology.Load(topo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := simprov.OpenFabric(tp); err == nil {
			f.Remove()
			f.Close()
		}
	})
	var out bytes.Buffer
	if err := simCmd([]string{"-topology", topo, "-link-down", "n0-n1", "-slow", "n2-n3=4", "-crash", "n3", "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"` + name + `": 4 nodes, 6 links`, "n0-n1", "down", "4x slower", "UB_NODE=<node>"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := simCmd([]string{"-topology", topo, "-clear", "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "down") || strings.Contains(out.String(), "slower") {
		t.Errorf("faults remain after -clear:\n%s", out.String())
	}
	// Faults in a named fabric stay there.
	out.Reset()
	if err := simCmd([]string{"-topology", topo, "-fabric", "other", "-link-down", "n0-n1", "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := simprov.OpenFabricNamed(tp, "other"); err == nil {
			f.Remove()
			f.Close()
		}
	})
	out.Reset()
	if err := simCmd([]string{"-topology", topo, "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "down") {
		t.Errorf("a fault in fabric \"other\" shows in the default one:\n%s", out.String())
	}
	for _, bad := range [][]string{{"-topology", topo, "-fabric", "../x"}, {"-topology", topo, "-link-down", "n0"}, {"-topology", topo, "-slow", "n0-n1=x"}, {"-topology", topo, "-crash", "nope"}, {"-topology", "/no/such.yaml"}} {
		if err := simCmd(append(bad, "-probe=false"), &bytes.Buffer{}); err == nil {
			t.Errorf("sim %q succeeded", bad)
		}
	}
}
