package shmsuite

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// shmipc-go lives in its own module (bench/shmipc) so that ubkit's users do
// not inherit its dependencies. BuildShmipc builds it once into the cache.

// BuildShmipc returns the path of the shmipc-go baseline program, building
// it from the repository's bench/shmipc module if it is missing or older
// than its sources. cacheDir is where the binary is kept.
func BuildShmipc(cacheDir string) (string, error) {
	src, err := findModuleDir("bench/shmipc")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cacheDir, "bin", "shmipc-bench")
	if fresh(bin, src) {
		return bin, nil
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the shmipc-go baseline in %s: %v\n%s", src, err, out)
	}
	return bin, nil
}

func findModuleDir(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/ubkit-io/ubkit\n")) {
			return filepath.Join(dir, rel), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("shmipc-go baseline: run from inside the ubkit repository (its %s module is built on demand)", rel)
		}
		dir = parent
	}
}

func fresh(bin, src string) bool {
	st, err := os.Stat(bin)
	if err != nil {
		return false
	}
	newer := false
	filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "go.mod") || strings.HasSuffix(p, "go.sum")) {
			if info, err := d.Info(); err == nil && info.ModTime().After(st.ModTime()) {
				newer = true
			}
		}
		return nil
	})
	return !newer
}

func runShmipc(bin, caseName string, d time.Duration, flags ...string) (bench.Measurement, error) {
	args := append([]string{"-case", caseName, "-duration", d.String(), "-batch", fmt.Sprint(Batch)}, flags...)
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return bench.Measurement{}, fmt.Errorf("shmipc-go %s: %v: %s", caseName, err, strings.TrimSpace(stderr.String()))
	}
	var r struct {
		Value float64 `json:"value"`
		P50   float64 `json:"p50"`
		P99   float64 `json:"p99"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return bench.Measurement{}, fmt.Errorf("shmipc-go %s: bad output %q: %v", caseName, out, err)
	}
	return bench.Measurement{Value: r.Value, P50: r.P50, P99: r.P99}, nil
}
