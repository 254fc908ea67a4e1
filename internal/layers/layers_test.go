package layers_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layer is a package's place in ubkit. Imports point down only: a package
// may import packages of lower layers, and of its own layer within the
// limits check gives.
type layer int

const (
	// layerHelpers: small internal packages below everything, imported by
	// any layer. They import the standard library and each other only.
	layerHelpers layer = iota
	layerShm
	layerUB
	layerTransport
	// layerAdapter: one family per ecosystem (cache, mesh, mq, fs, k8s),
	// each independent of the others.
	layerAdapter
	// layerTestSupport: harnesses that the tests of every layer and the
	// programs use (real servers, benchmark measurement). Their non-test
	// code must not be imported by library code.
	layerTestSupport
	// layerProgram: commands, examples and what only they use; they may
	// import anything.
	layerProgram
)

func (l layer) String() string {
	return [...]string{"helper", "shm", "ub", "transport", "adapter", "test support", "program"}[l]
}

// layers places every package of the module by pattern: "p" is the
// package p, "p/..." is p and every package below it. An exact pattern
// wins, else the longest "/..." one. A package no pattern matches fails
// TestLayers: add it here.
var layers = []struct {
	pattern string
	layer   layer
}{
	{"internal/fdlimit", layerHelpers},  // names running out of file descriptors in errors
	{"internal/rundir", layerHelpers},   // the runtime directory: its owner, mode and locks
	{"internal/procstat", layerHelpers}, // what a process holds, read from /proc
	{"internal/osproc", layerHelpers},   // child processes' attributes, and signals

	{"shm/...", layerShm},
	{"ub/...", layerUB}, // the verbs API, ub/topology, ub/provider/..., ub/ubtest
	{"transport/...", layerTransport},

	{"cache/...", layerAdapter},
	{"mesh/...", layerAdapter},
	{"mq/...", layerAdapter},
	{"fs/...", layerAdapter},
	{"k8s/...", layerAdapter},

	{"internal/testenv", layerTestSupport},         // real servers, other users, network namespaces
	{"internal/testenv/brokers", layerTestSupport}, // tests of testenv's real brokers with the upstream clients
	{"internal/testenv/k8sbin", layerProgram},      // make prereqs's build of the Kubernetes test binaries
	{"internal/testenv/withbrokers", layerProgram}, // make examples's runner of the examples that need brokers
	{"internal/bench", layerTestSupport},           // measurements, reports, benchmark peer processes
	{"internal/bench/benchtest", layerTestSupport}, // the suites' shared test helpers

	{"internal/bench/...", layerProgram},     // the suites of ubctl bench
	{"internal/meshsim", layerProgram},       // the simulated mesh of ubctl demo, examples/mesh-proxy and the mesh suite
	{"internal/layers", layerProgram},        // this test
	{"internal/examplescheck", layerProgram}, // the check that examples import only public packages
	{"k8s/cmd/...", layerProgram},
	{"cmd/...", layerProgram},
	{"examples/...", layerProgram},
}

// rawImports reach memory or the kernel around the type system and the
// portable standard library.
var rawImports = map[string]bool{
	"unsafe":                   true,
	"syscall":                  true,
	"golang.org/x/sys/unix":    true,
	"golang.org/x/sys/windows": true,
	"C":                        true,
}

// rawAllowed are the packages that may import rawImports, and why.
var rawAllowed = []struct{ pattern, why string }{
	{"shm/...", "the shared-memory layer: segments, futexes, descriptors, and the system calls and errors the layers above need"},
	{"ub/provider/...", "a provider binds the verbs to its medium"},
	{"internal/fdlimit", "it reads RLIMIT_NOFILE and tells EMFILE and ENFILE apart"},
	{"internal/rundir", "it checks the owner and mode of runtime directories (Stat_t) and locks files in them (flock)"},
	{"internal/osproc", "it sets child processes' system attributes (parent-death signal, process group, credentials) and names signals"},
}

// rawFiles are test files outside rawAllowed that may import rawImports
// too, each for a reason no API of shm can serve.
var rawFiles = map[string]string{
	"transport/shmattack_test.go": "it plays a hostile peer: it forges descriptors and socket messages that shm refuses to make",
}

// match reports whether a package (a path inside the module) matches a
// pattern of layers or rawAllowed, and how specific the match is: 0 for
// no match, more for a longer pattern, most for an exact one.
func match(pattern, pkg string) int {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		if pkg == base || strings.HasPrefix(pkg, base+"/") {
			return len(base) + 1
		}
		return 0
	}
	if pkg == pattern {
		return 1 << 20
	}
	return 0
}

// layerOf returns a package's layer, or false if the table has none.
func layerOf(pkg string) (layer, bool) {
	best, l := 0, layer(0)
	for _, e := range layers {
		if m := match(e.pattern, pkg); m > best {
			best, l = m, e.layer
		}
	}
	return l, best > 0
}

// family is the adapter a package of layerAdapter belongs to.
func family(pkg string) string {
	f, _, _ := strings.Cut(pkg, "/")
	return f
}

func isProvider(pkg string) bool { return match("ub/provider/...", pkg) > 0 }

// check returns what is wrong with an import of file, a file of package
// pkg (both inside the module; test says whether file is a _test.go
// file), or "". imp is the import path with the module's path cut off and
// local true if it is one of the module's packages.
func check(pkg, file string, test bool, imp string, local bool) string {
	from, ok := layerOf(pkg)
	if !ok {
		return fmt.Sprintf("package %s has no layer: add it to the layers table in internal/layers/layers_test.go", pkg)
	}
	if !local {
		if !rawImports[imp] {
			return ""
		}
		for _, a := range rawAllowed {
			if match(a.pattern, pkg) > 0 {
				return ""
			}
		}
		if test && rawFiles[file] != "" {
			return ""
		}
		return fmt.Sprintf("%s (package %s) imports %s: unsafe and raw system calls belong in shm (or a provider's internals); use or add an shm function", file, pkg, imp)
	}
	to, ok := layerOf(imp)
	if !ok {
		return fmt.Sprintf("package %s (imported by %s) has no layer: add it to the layers table in internal/layers/layers_test.go", imp, file)
	}
	switch {
	case from == layerProgram:
		return ""
	case isProvider(imp) && !isProvider(pkg) && !test && from != layerTestSupport:
		return fmt.Sprintf("%s (package %s, %s layer) imports the provider %s: programs and tests choose providers by importing them, like database/sql drivers; library code opens them by name", file, pkg, from, imp)
	case to == layerTestSupport && (test || from == layerTestSupport):
		return ""
	case to > from:
		return fmt.Sprintf("%s (package %s, %s layer) imports %s (%s layer): imports point down only", file, pkg, from, imp, to)
	case to == from && from == layerAdapter && family(pkg) != family(imp):
		return fmt.Sprintf("%s (package %s) imports %s: adapters are independent of each other; reach another adapter's processes through transport or ub", file, pkg, imp)
	}
	return ""
}

// listed is what go list says about a package.
type listed struct {
	ImportPath     string
	Dir            string
	GoFiles        []string
	CgoFiles       []string
	TestGoFiles    []string
	XTestGoFiles   []string
	IgnoredGoFiles []string // for other systems or architectures: checked too
	Module         *struct{ Path, Dir string }
	Error          *struct{ Err string }
}

// goList lists the module's packages, run from the module's root.
func goList(t *testing.T) []listed {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the module's packages: %v (put Go's bin directory on PATH)", err)
	}
	root, err := exec.Command(gobin, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-e", "-json", "./...")
	cmd.Dir = strings.TrimSpace(string(root))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -e -json ./...: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

// TestLayers checks every import of every Go file of the module, test
// files and files for other systems included, against the rules of check.
func TestLayers(t *testing.T) {
	fset := token.NewFileSet()
	for _, p := range goList(t) {
		if p.Error != nil {
			t.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
			continue
		}
		if p.Module == nil {
			t.Fatalf("go list: %s is in no module", p.ImportPath)
		}
		mod := p.Module.Path
		pkg, err := filepath.Rel(p.Module.Dir, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		pkg = filepath.ToSlash(pkg)
		files := slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles, p.TestGoFiles, p.XTestGoFiles)
		for _, name := range files {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				t.Errorf("%s/%s: %v", pkg, name, err)
				continue
			}
			file := pkg + "/" + name
			test := strings.HasSuffix(name, "_test.go")
			for _, is := range f.Imports {
				imp, err := strconv.Unquote(is.Path.Value)
				if err != nil {
					t.Errorf("%s: import %s: %v", file, is.Path.Value, err)
					continue
				}
				rel, local := strings.CutPrefix(imp, mod+"/")
				if imp == mod {
					rel, local = ".", true
				}
				if problem := check(pkg, file, test, rel, local); problem != "" {
					t.Error(problem)
				}
			}
		}
	}
}

// TestCheck: the rules flag what they are for and allow the rest, so that
// TestLayers passing means something.
func TestCheck(t *testing.T) {
	cases := []struct {
		pkg, file string
		imp       string
		local     bool
		want      string // in the problem; "" for none
	}{
		{"shm", "shm/segment.go", "golang.org/x/sys/unix", false, ""},
		{"shm", "shm/segment.go", "internal/rundir", true, ""},
		{"shm", "shm/segment.go", "ub", true, "imports point down only"},
		{"shm", "shm/ring_test.go", "internal/testenv", true, ""},
		{"shm", "shm/ring.go", "internal/testenv", true, "imports point down only"},
		{"ub/provider/tcpprov", "ub/provider/tcpprov/conn.go", "syscall", false, ""},
		{"ub/provider/simprov", "ub/provider/simprov/provider.go", "ub/provider/shmprov", true, ""},
		{"ub", "ub/registry.go", "ub/topology", true, ""},
		{"ub", "ub/registry.go", "transport", true, "imports point down only"},
		{"ub/ubtest", "ub/ubtest/ubtest.go", "syscall", false, "belong in shm"},
		{"transport", "transport/poll.go", "syscall", false, "belong in shm"},
		{"transport", "transport/listen.go", "golang.org/x/sys/unix", false, "belong in shm"},
		{"transport", "transport/conn.go", "unsafe", false, "belong in shm"},
		{"transport", "transport/conn_test.go", "syscall", false, "belong in shm"},
		{"transport", "transport/shmattack_test.go", "syscall", false, ""},
		{"transport", "transport/endpoint.go", "ub/provider/simprov", true, "choose providers"},
		{"transport", "transport/paths_test.go", "ub/provider/simprov", true, ""},
		{"transport", "transport/conn.go", "cache", true, "imports point down only"},
		{"transport/mux", "transport/mux/mux.go", "transport/internal/deadline", true, ""},
		{"cache", "cache/store.go", "shm", true, ""},
		{"cache", "cache/store.go", "mesh", true, "adapters are independent"},
		{"mesh", "mesh/proxy.go", "cache/memcached", true, "adapters are independent"},
		{"mesh", "mesh/proxy.go", "internal/meshsim", true, "imports point down only"},
		{"cache/rediscache", "cache/rediscache/client.go", "cache", true, ""},
		{"internal/fdlimit", "internal/fdlimit/fdlimit.go", "syscall", false, ""},
		{"internal/fdlimit", "internal/fdlimit/fdlimit.go", "shm", true, "imports point down only"},
		{"internal/testenv", "internal/testenv/servers.go", "shm", true, ""},
		{"internal/testenv", "internal/testenv/user.go", "syscall", false, "belong in shm"},
		{"internal/bench/cachesuite", "internal/bench/cachesuite/suite.go", "cache/rediscache", true, ""},
		{"cmd/ubctl", "cmd/ubctl/main.go", "ub/provider/simprov", true, ""},
		{"cmd/ubctl", "cmd/ubctl/main.go", "syscall", false, "belong in shm"},
		{"examples/shm-stream", "examples/shm-stream/main.go", "internal/testenv", true, ""},
		{"newpkg", "newpkg/a.go", "shm", true, "has no layer"},
		{"transport", "transport/conn.go", "newpkg", true, "has no layer"},
	}
	for _, c := range cases {
		got := check(c.pkg, c.file, strings.HasSuffix(c.file, "_test.go"), c.imp, c.local)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%s importing %s: %q, want a problem containing %q", c.file, c.imp, got, c.want)
		}
	}
}
