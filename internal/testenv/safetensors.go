package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// SafetensorsVersion and NumpyVersion are the Python packages that
// prereqs.sh installs (keep the three in step).
const (
	SafetensorsVersion = "0.6.2"
	NumpyVersion       = "2.2.6"
)

// Safetensors returns the python3 to run and the directory to put on
// PYTHONPATH for Python's safetensors and numpy, which prereqs.sh
// installs under $UBKIT_CACHE/python (`make test` runs it). Its error
// names what is missing and how to get it.
func Safetensors() (python, pythonPath string, err error) {
	python, err = exec.LookPath("python3")
	if err != nil {
		return "", "", errors.New("testenv: python3 is missing: install the Debian package python3 (make test does)")
	}
	cache, err := cacheDir()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, "python", "safetensors-"+SafetensorsVersion+"-numpy-"+NumpyVersion)
	for _, pkg := range []string{"safetensors", "numpy"} {
		if _, err := os.Stat(filepath.Join(dir, pkg, "__init__.py")); err != nil {
			return "", "", fmt.Errorf("testenv: Python %s is not in %s: run make prereqs (internal/testenv/prereqs.sh) with UBKIT_CACHE=%s",
				pkg, dir, cache)
		}
	}
	return python, dir, nil
}
