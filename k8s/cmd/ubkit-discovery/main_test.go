package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/k8s/discovery"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// npuRoot is a small node: two Ascend NPUs, their driver and firmware,
// and a kernel.
func npuRoot(t *testing.T) string {
	root := t.TempDir()
	for p, content := range map[string]string{
		"dev/davinci0": "", "dev/davinci1": "", "dev/davinci_manager": "",
		"usr/local/Ascend/driver/version.info":   "Version=24.1.rc2\npackage_version=24.1.rc2\n",
		"usr/local/Ascend/firmware/version.info": "Version=7.5.0.1.129\nfirmware_version=1.0\n",
		"proc/sys/kernel/osrelease":              "5.10.0-182.0.0.95.oe2203sp3.aarch64\n",
	} {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestOnce(t *testing.T) {
	t.Setenv("UB_TOPOLOGY", "example:dev4")
	t.Setenv("UB_NODE", "n2")
	t.Setenv("NODE_NAME", "")
	dir := t.TempDir()
	var out, errs bytes.Buffer
	err := run([]string{"-root", npuRoot(t), "-features-dir", dir, "-npu-driver", ">=25", "-npu-firmware", "7.5.0.1.129", "-kernel", ">=6.6", "-once"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s", err, errs.String())
	}
	var got struct {
		Report *discovery.Report
		Labels map[string]string
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	for k, v := range map[string]string{"npu.count": "2", "node": "n2", "npu.driver-match": "false", "npu.firmware-match": "true", "kernel.version-match": "false"} {
		if got.Labels["supernode.ubkit.io/"+k] != v {
			t.Errorf("label %s = %q, want %q", k, got.Labels["supernode.ubkit.io/"+k], v)
		}
	}
	for _, check := range []string{"type=NPUDriverVersion status=False reason=VersionTooOld", "type=KernelVersion status=False reason=VersionTooOld"} {
		if !strings.Contains(errs.String(), check) {
			t.Errorf("the failed check %q is not logged:\n%s", check, errs.String())
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, discovery.DefaultFeatureFile)); err != nil || !strings.Contains(string(b), "supernode.ubkit.io/npu.count=2\n") {
		t.Errorf("feature file %q, %v", b, err)
	}
}

func TestUsage(t *testing.T) {
	var out, errs bytes.Buffer
	if err := run([]string{"-bogus"}, &out, &errs); !errors.Is(err, errUsage) {
		t.Errorf("bad flag: %v", err)
	}
	if err := run([]string{"extra"}, &out, &errs); !errors.Is(err, errUsage) {
		t.Errorf("argument: %v", err)
	}
}

// The command against a real apiserver without NFD: -direct-labels labels
// the Node.
func TestDirectLabels(t *testing.T) {
	t.Setenv("UB_TOPOLOGY", "example:dev4")
	t.Setenv("UB_NODE", "n0")
	c := k8stest.Start(t, k8stest.Config{})
	ctx := t.Context()
	if _, err := c.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dev4-n0", Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	args := []string{"-root", npuRoot(t), "-features-dir", "", "-kubeconfig", c.Kubeconfig(), "-node-name", "dev4-n0", "-once"}
	if err := run(args, &out, &errs); !errors.Is(err, discovery.ErrNoNodeFeatureCRD) {
		t.Errorf("without NFD or -direct-labels: %v, want ErrNoNodeFeatureCRD", err)
	}
	if err := run(append(args, "-direct-labels"), &out, &errs); err != nil {
		t.Fatalf("%v\n%s", err, errs.String())
	}
	n, err := c.Client().CoreV1().Nodes().Get(ctx, "dev4-n0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels["supernode.ubkit.io/id"] != "dev4" || n.Labels["supernode.ubkit.io/npu.count"] != "2" || n.Labels["team"] != "a" {
		t.Errorf("labels %v", n.Labels)
	}
}

// The check for devices that came or went: on by default, off with
// -check-interval=0; intervals that cannot be are usage errors.
func TestIntervalFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.cfg.Interval != discovery.DefaultInterval || o.cfg.CheckInterval != discovery.DefaultCheckInterval {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	if o, err := parseFlags([]string{"-check-interval", "250ms", "-interval", "10m"}, io.Discard); err != nil || o.cfg.CheckInterval != 250*time.Millisecond || o.cfg.Interval != 10*time.Minute {
		t.Errorf("-check-interval 250ms: %+v, %v", o, err)
	}
	// 0 in a discovery.Config means the default: the flag's 0 must reach
	// the agent as "never".
	if o, err := parseFlags([]string{"-check-interval", "0"}, io.Discard); err != nil || o.cfg.CheckInterval >= 0 {
		t.Errorf("-check-interval 0: %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-check-interval", "-1s"}, {"-interval", "0"}, {"-interval", "-1m"}} {
		if _, err := parseFlags(bad, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}
