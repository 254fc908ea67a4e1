package examplescheck

import (
	"bufio"
	"bytes"
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestExamplesImportOnlyPublicPackages parses every Go file under
// examples/ and every example_test.go outside internal directories, and
// fails on an import of one of the module's internal packages (Go would
// refuse to build such a file once copied out of the repository).
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	root, module := moduleRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if path != root && skipDir(path, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		inExamples := strings.HasPrefix(rel, "examples"+string(filepath.Separator))
		isExample := d.Name() == "example_test.go" && !slices.Contains(strings.Split(filepath.Dir(rel), string(filepath.Separator)), "internal")
		if strings.HasSuffix(d.Name(), ".go") && (inExamples || isExample) {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var programs int
	for _, f := range files {
		if strings.HasPrefix(f, "examples"+string(filepath.Separator)) {
			programs++
		}
	}
	if programs == 0 {
		t.Fatalf("no Go files under %s: the check would pass on nothing", filepath.Join(root, "examples"))
	}

	fset := token.NewFileSet()
	for _, rel := range files {
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if internalTo(path, module) {
				t.Errorf("%s: imports %s, an internal package: a copy outside the repository would not build; use public API (inline what it does)",
					fset.Position(imp.Pos()), path)
			}
		}
	}
	t.Logf("%d files checked, %d of them under examples/", len(files), programs)
}

// internalTo says whether import path is an internal package of module:
// the module itself or a package below it with an "internal" element.
func internalTo(path, module string) bool {
	rest, ok := strings.CutPrefix(path, module)
	if !ok || (rest != "" && rest[0] != '/') {
		return false
	}
	return slices.Contains(strings.Split(rest, "/"), "internal")
}

func TestInternalTo(t *testing.T) {
	const m = "github.com/ubkit-io/ubkit"
	for path, want := range map[string]bool{
		m + "/internal/testenv":                       true,
		m + "/internal":                               true,
		m + "/ub/internal/verbs":                      true,
		m + "/mesh":                                   false,
		m + "/cache/rediscache":                       false,
		m + "x/internal/foo":                          false, // another module
		"github.com/other/internal/pkg":               false,
		"google.golang.org/grpc/credentials/insecure": false,
	} {
		if got := internalTo(path, m); got != want {
			t.Errorf("internalTo(%q) = %v, want %v", path, got, want)
		}
	}
}

// skipDir leaves out what is not this module's source: hidden directories
// (the build cache, .git), testdata and nested modules.
func skipDir(path, name string) bool {
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" {
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil
}

// moduleRoot finds the directory of go.mod above the test's and the module
// path it declares.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
