package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// PymemcacheVersion is the pymemcache that prereqs.sh installs (keep the
// two in step).
const PymemcacheVersion = "4.0.0"

// Pymemcache returns the python3 to run and the directory to put on
// PYTHONPATH for pymemcache, the independent memcached client that
// prereqs.sh installs under $UBKIT_CACHE/python/pymemcache-<version>
// (`make test` runs it). Without $UBKIT_CACHE it looks in the module
// root's .cache, prereqs.sh's default. Its error names what is missing
// and how to get it.
func Pymemcache() (python, pythonPath string, err error) {
	python, err = exec.LookPath("python3")
	if err != nil {
		return "", "", errors.New("testenv: python3 is missing: install the Debian package python3 (make test does)")
	}
	cache, err := cacheDir()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, "python", "pymemcache-"+PymemcacheVersion)
	if _, err := os.Stat(filepath.Join(dir, "pymemcache", "__init__.py")); err != nil {
		return "", "", fmt.Errorf("testenv: pymemcache %s is not in %s: run make prereqs (internal/testenv/prereqs.sh) with UBKIT_CACHE=%s",
			PymemcacheVersion, dir, cache)
	}
	return python, dir, nil
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
