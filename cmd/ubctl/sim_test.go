package main

import (
	"bytes"
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
	t.Cleanup(func() {
		if f, err := simprov.OpenFabric(tp); err == nil {
			f.Remove()
			f.Close()
		}
	})
	var out bytes.Buffer
	if err := simCmd([]string{"-topology", "dev4", "-link-down", "n0-n1", "-slow", "n2-n3=4", "-crash", "n3", "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"dev4": 4 nodes, 6 links`, "n0-n1", "down", "4x slower", "UB_NODE=<node>"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := simCmd([]string{"-topology", "dev4", "-clear", "-probe=false"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "down") || strings.Contains(out.String(), "slower") {
		t.Errorf("faults remain after -clear:\n%s", out.String())
	}
	for _, bad := range [][]string{{"-topology", "dev4", "-link-down", "n0"}, {"-topology", "dev4", "-slow", "n0-n1=x"}, {"-topology", "dev4", "-crash", "nope"}, {"-topology", "/no/such.yaml"}} {
		if err := simCmd(append(bad, "-probe=false"), &bytes.Buffer{}); err == nil {
			t.Errorf("sim %q succeeded", bad)
		}
	}
}
