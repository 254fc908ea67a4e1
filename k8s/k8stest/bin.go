package k8stest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The versions k8stest runs: Kubernetes matches the client-go that ubkit
// requires (v0.37.x), and etcd is the one Kubernetes 1.37 pins.
// [Build] builds these.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.0"
	KwokVersion       = "v0.8.0"
)

// EnvBinDir names the environment variable that overrides [DefaultBinDir].
const EnvBinDir = "UBKIT_K8S_BIN"

// DefaultBinDir returns the directory that holds the binaries: the value
// of UBKIT_K8S_BIN if set, else ubkit/k8s under the user's cache
// directory (${XDG_CACHE_HOME:-$HOME/.cache}/ubkit/k8s on Linux). Inside
// it, kubernetes-<version>/ holds kube-apiserver, kube-controller-manager
// and kube-scheduler, etcd-<version>/ holds etcd, and kwok-<version>/
// holds kwok and its stages/ (the YAML files of the kwok module's
// kustomize/stage/ directory).
func DefaultBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		return dir, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("k8stest: no directory for the Kubernetes binaries (set %s): %w", EnvBinDir, err)
	}
	return filepath.Join(cache, "ubkit", "k8s"), nil
}

// binaries are the paths of the programs a Cluster runs.
type binaries struct {
	apiserver, controllerManager, scheduler, etcd, kwok, stages string
}

func findBinaries(root string) binaries {
	kube := filepath.Join(root, "kubernetes-"+KubernetesVersion)
	kwok := filepath.Join(root, "kwok-"+KwokVersion)
	return binaries{
		apiserver:         filepath.Join(kube, "kube-apiserver"),
		controllerManager: filepath.Join(kube, "kube-controller-manager"),
		scheduler:         filepath.Join(kube, "kube-scheduler"),
		etcd:              filepath.Join(root, "etcd-"+EtcdVersion, "etcd"),
		kwok:              filepath.Join(kwok, "kwok"),
		stages:            filepath.Join(kwok, "stages"),
	}
}

// errMissing says how to get a missing binary.
func errMissing(what, path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("k8stest: %s is missing (%s): k8stest.Build builds it (`make prereqs` in ubkit's module and `ubctl demo k8s` call it; the first build takes about 15 minutes), or set %s to a directory that has it", what, path, EnvBinDir)
	}
	return fmt.Errorf("k8stest: %s (%s): %w", what, path, err)
}

// need checks that the program at path exists and can be run.
func need(what, path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return errMissing(what, path, err)
	}
	if !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
		return fmt.Errorf("k8stest: %s (%s) is not an executable file: remove it and build it again (k8stest.Build or `make prereqs`)", what, path)
	}
	return nil
}
