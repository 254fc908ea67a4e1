package topology

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func dir() *fstest.MapFile { return &fstest.MapFile{Mode: os.ModeDir | 0o755} }

const meminfo = "MemTotal:       16314372 kB\nMemFree:         1000000 kB\n"

func TestDiscoverFS(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   fstest.MapFS
		want Node
		err  string
	}{
		{
			name: "numa server with accelerators",
			fs: fstest.MapFS{
				"proc/sys/kernel/hostname":           file("node07\n"),
				"sys/devices/system/cpu/online":      file("0-63,96-127\n"),
				"proc/cpuinfo":                       file("processor : 0\n"),
				"proc/meminfo":                       file(meminfo),
				"sys/devices/system/node/node0":      dir(),
				"sys/devices/system/node/node1":      dir(),
				"sys/devices/system/node/possible":   file("0-1\n"),
				"dev/davinci0":                       file(""),
				"dev/davinci1":                       file(""),
				"dev/davinci_manager":                file(""),
				"dev/nvidia0":                        file(""),
				"dev/nvidiactl":                      file(""),
				"sys/class/uacce/hisi_zip-0":         dir(),
				"sys/class/uacce/hisi_sec2-1":        dir(),
				"sys/class/uacce/something-else-0/x": file(""),
			},
			want: Node{
				Name: "node07", Kind: Compute, CPUs: 96, NUMANodes: 2, MemoryBytes: 16314372 << 10,
				Devices: []Device{{Kind: GPU, Count: 1}, {Kind: NPU, Count: 2}, {Kind: KAE, Count: 2}},
			},
		},
		{
			name: "cpuinfo only, no NUMA directory",
			fs: fstest.MapFS{
				"proc/sys/kernel/hostname": file("my laptop.local\n"),
				"proc/cpuinfo":             file("processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n"),
				"proc/meminfo":             file(meminfo),
			},
			want: Node{Name: "my-laptop.local", Kind: Compute, CPUs: 2, NUMANodes: 1, MemoryBytes: 16314372 << 10},
		},
		{
			name: "nothing readable",
			fs:   fstest.MapFS{},
			want: Node{Name: "localhost", Kind: Compute},
		},
		{
			name: "bad CPU list",
			fs:   fstest.MapFS{"sys/devices/system/cpu/online": file("0-x\n")},
			err:  `/sys/devices/system/cpu/online: bad CPU list "0-x"`,
		},
		{
			name: "bad meminfo",
			fs:   fstest.MapFS{"proc/meminfo": file("MemTotal: lots\n")},
			err:  `/proc/meminfo: cannot read "MemTotal: lots"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := DiscoverFS(tc.fs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("DiscoverFS = %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if topo.Name != tc.want.Name || len(topo.Nodes) != 1 || len(topo.Links) != 0 {
				t.Fatalf("topology %+v", topo)
			}
			if !reflect.DeepEqual(topo.Nodes[0], tc.want) {
				t.Errorf("node %+v\nwant %+v", topo.Nodes[0], tc.want)
			}
		})
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"": 0, "0": 1, "0-3": 4, "0-3,8,10-11": 7} {
		if got, err := countCPUList(in); err != nil || got != want {
			t.Errorf("countCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"a", "3-1", "-1", "0-99999999", "1,,2"} {
		if _, err := countCPUList(in); err == nil {
			t.Errorf("countCPUList(%q) succeeded", in)
		}
	}
}

func TestDiscoverThisHost(t *testing.T) {
	topo, err := Discover()
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if n := topo.Nodes[0]; n.Name != nodeName(host) || n.CPUs < 1 || n.MemoryBytes <= 0 {
		t.Errorf("this host: %+v", n)
	}
}

func TestFromEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.yaml")
	if err := os.WriteFile(path, []byte(smallYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env, want, err string
	}{
		{name: "unset: this host", env: "", want: nodeName(hostname(t))},
		{name: "file", env: path, want: "small"},
		{name: "inline YAML", env: smallYAML, want: "small"},
		{name: "inline JSON", env: smallJSON, want: "small"},
		{name: "inline JSON on one line", env: `{"name": "one", "nodes": [{"name": "a"}]}`, want: "one"},
		{name: "example", env: "example:dev4", want: "dev4"},
		{name: "missing file", env: "/nonexistent/t.yaml", err: "UB_TOPOLOGY: open /nonexistent/t.yaml"},
		{name: "bad inline", env: "name: x\nnodes: []\n", err: `UB_TOPOLOGY: topology "x": nodes: a topology needs at least one node`},
		{name: "no such example", env: "example:nope", err: `UB_TOPOLOGY: topology: no example "nope" (have cm384, dev4, laptop)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvTopology, tc.env)
			topo, err := FromEnv()
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("FromEnv = %v, want an error starting %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if topo.Name != tc.want {
				t.Errorf("FromEnv gave %q, want %q", topo.Name, tc.want)
			}
		})
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestLocalNode(t *testing.T) {
	dev4, err := Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	laptop, _ := Example("laptop")
	star := mustNew(t, []string{"c"}) // one compute node
	withSwitch, err := New("sw", []Node{{Name: "sw", Kind: Switch}, {Name: "only"}}, []Link{link("sw", "only", 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	host := nodeName(hostname(t))
	named, err := New("named", []Node{{Name: "other"}, {Name: host}}, []Link{link("other", host, 1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		topo *Topology
		env  string
		want string
		err  string
	}{
		{name: "UB_NODE", topo: dev4, env: "n2", want: "n2"},
		{name: "UB_NODE unknown", topo: dev4, env: "n9", err: `UB_NODE=n9: topology: unknown node "n9" in topology "dev4"`},
		{name: "UB_NODE a switch", topo: withSwitch, env: "sw", err: `UB_NODE=sw: "sw" is a switch in topology "sw"; a process plays a compute node`},
		{name: "host name", topo: named, want: host},
		{name: "only node", topo: laptop, want: "laptop"},
		{name: "only compute node", topo: withSwitch, want: "only"},
		{name: "single", topo: star, want: "c"},
		{name: "ambiguous", topo: dev4, err: `topology "dev4" has several compute nodes and none is named "` + host + `" like this host: set UB_NODE to the node this process plays`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvNode, tc.env)
			n, err := LocalNode(tc.topo)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("LocalNode = %v, want error %q", err, tc.err)
				}
				if strings.HasPrefix(tc.err, "UB_NODE=n9") && !errors.Is(err, ErrUnknownNode) {
					t.Errorf("%v does not wrap ErrUnknownNode", err)
				}
				return
			}
			if err != nil || n.Name != tc.want {
				t.Fatalf("LocalNode = %q, %v; want %q", n.Name, err, tc.want)
			}
		})
	}
}

func TestNodeName(t *testing.T) {
	for in, want := range map[string]string{
		"node07\n":         "node07",
		"host.example.com": "host.example.com",
		"my laptop":        "my-laptop",
		"-x":               "x",
		"":                 "localhost",
		"ünï":              "n",
	} {
		if got := nodeName(in); got != want || !validName(got) {
			t.Errorf("nodeName(%q) = %q, want %q", in, got, want)
		}
	}
}
