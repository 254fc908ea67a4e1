package discovery_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ubkit-io/ubkit/k8s/discovery"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// Scan a root directory (here a tiny one: two Ascend NPUs and a KAE
// compression engine) as node n1 of the dev4 super node, and print the
// labels and the features.d file it stands for.
func ExampleScan() {
	root, err := os.MkdirTemp("", "discovery-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(root)
	for p, content := range map[string]string{
		"dev/davinci0":                                   "",
		"dev/davinci1":                                   "",
		"dev/davinci_manager":                            "",
		"usr/local/Ascend/driver/version.info":           "Version=24.1.rc2\n",
		"sys/class/uacce/hisi_zip-0/api":                 "hisi_qm_v2\n",
		"sys/class/uacce/hisi_zip-0/algorithms":          "zlib\ngzip\n",
		"sys/class/uacce/hisi_zip-0/available_instances": "256\n",
		"sys/class/uacce/hisi_zip-0/flags":               "1\n",
	} {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o644)
	}
	topo, _ := topology.Example("dev4")
	r, err := discovery.Scan(discovery.ScanOptions{
		Root: root, Topology: topo, TopologyNode: "n1",
		Versions: map[discovery.DeviceKind]discovery.VersionPolicy{discovery.NPU: {Minimum: "24.1"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range r.Conditions {
		fmt.Printf("%s=%s (%s)\n", c.Type, c.Status, c.Reason)
	}
	fmt.Print(string(discovery.FeatureFile(r.Labels())))
	// Output:
	// Identity=True (Found)
	// NPUDriverVersion=True (VersionMatches)
	// KAEDriverVersion=True (NoPolicy)
	// # Written by ubkit-discovery; rewritten on every change. Do not edit.
	// supernode.ubkit.io/id=dev4
	// supernode.ubkit.io/kae.count=1
	// supernode.ubkit.io/kae.zip=true
	// supernode.ubkit.io/node=n1
	// supernode.ubkit.io/npu.count=2
	// supernode.ubkit.io/npu.driver=24.1.rc2
	// supernode.ubkit.io/npu.driver-match=true
	// supernode.ubkit.io/ub-bandwidth=5000000000
}
