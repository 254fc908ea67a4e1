package k8stest

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
)

// buildScript builds the binaries; Build runs it.
//
//go:embed build.sh
var buildScript string

// The sets of binaries [Build] builds.
const (
	BuildEtcd       = "etcd"
	BuildKwok       = "kwok"
	BuildKubernetes = "kubernetes"
)

// Build builds the binaries that are missing from dir ([DefaultBinDir] if
// dir is empty), from the Go modules of [KubernetesVersion],
// [EtcdVersion] and [KwokVersion]. It writes a line to progress (if not
// nil) as it starts each binary; the go commands' own output is kept, and
// its end is part of the error if the build fails. which names the sets to build
// ([BuildEtcd], [BuildKwok], [BuildKubernetes]); none means all three.
// What is already there is kept, so a second call returns at once.
//
// It needs bash and the go command on PATH, and the Go module proxy (or a
// module cache that has the modules). The first build of Kubernetes takes
// about 15 minutes on two idle cores; with the Go build cache warm a
// rebuild takes seconds to minutes. Each set is built in a temporary
// directory beside its destination and renamed into place when complete,
// so an interrupted build leaves nothing half-made. Ending ctx stops the
// build.
func Build(ctx context.Context, dir string, progress io.Writer, which ...string) error {
	for _, w := range which {
		if !slices.Contains([]string{BuildEtcd, BuildKwok, BuildKubernetes}, w) {
			return fmt.Errorf("k8stest: no binaries named %q to build (%s, %s or %s)", w, BuildEtcd, BuildKwok, BuildKubernetes)
		}
	}
	if dir == "" {
		var err error
		if dir, err = DefaultBinDir(); err != nil {
			return err
		}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("k8stest: %w", err)
	}
	for _, tool := range []string{"bash", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("k8stest: building the Kubernetes binaries needs %s on PATH: %w", tool, err)
		}
	}
	if progress == nil {
		progress = io.Discard
	}
	var log tail
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", buildScript, "build.sh"}, which...)...)
	cmd.Env = append(os.Environ(),
		EnvBinDir+"="+dir,
		"K8STEST_KUBERNETES_VERSION="+KubernetesVersion,
		"K8STEST_ETCD_VERSION="+EtcdVersion,
		"K8STEST_KWOK_VERSION="+KwokVersion,
	)
	// The script's own lines go to stdout, the go commands' to stderr.
	cmd.Stdout, cmd.Stderr = progress, &log
	// The build is go commands under bash: stop them all when ctx ends,
	// and let the script remove its temporary directories.
	waited := osproc.StopGroupOnCancel(cmd, 10*time.Second)
	osproc.DieWithParent(cmd)
	err = cmd.Run()
	waited()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("k8stest: building the Kubernetes binaries into %s: %w", dir, errors.Join(ctx.Err(), err))
		}
		return fmt.Errorf("k8stest: building the Kubernetes binaries into %s failed: %w; the end of its output:\n%s", dir, err, log.String())
	}
	return nil
}

// tail keeps the last tailMax bytes written to it.
type tail struct{ b []byte }

const tailMax = 4 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
	return len(p), nil
}

// String returns the last tailMax bytes, from a line's start.
func (t *tail) String() string {
	b := t.b
	if len(b) > tailMax {
		b = b[len(b)-tailMax:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(bytes.TrimSpace(b))
}

// Missing returns the binaries a [Cluster] can run that are not in dir
// ([DefaultBinDir] if empty), as paths relative to it; none means all
// are there.
func Missing(dir string) ([]string, error) {
	if dir == "" {
		var err error
		if dir, err = DefaultBinDir(); err != nil {
			return nil, err
		}
	}
	b := findBinaries(dir)
	var missing []string
	for _, p := range []string{b.etcd, b.apiserver, b.controllerManager, b.scheduler, b.kwok, b.stages} {
		if _, err := os.Stat(p); err != nil {
			rel, rerr := filepath.Rel(dir, p)
			if rerr != nil {
				rel = p
			}
			missing = append(missing, rel)
		}
	}
	return missing, nil
}
