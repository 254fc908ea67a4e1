// Command ubkit-discovery is ubkit's node discovery agent (package
// k8s/discovery): run on every node (a DaemonSet, k8s/config/discovery), it
// finds the node's super-node identity and devices and publishes them the
// NFD way.
//
//	ubkit-discovery [-root /host] [-interval 1m] [-check-interval 2s] [-features-dir DIR]
//	                [-node-name NODE] [-kubeconfig FILE] [-namespace NS]
//	                [-direct-labels] [-gpu-driver V] [-npu-driver V] [-kae-driver V]
//	                [-gpu-firmware V] [-npu-firmware V] [-kernel V] [-once]
//
// The identity comes from UB_TOPOLOGY and UB_NODE (ub/topology). Without
// -node-name (or NODE_NAME) it does not touch the cluster.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/k8s/discovery"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ubkit-discovery:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// options are the command's flags.
type options struct {
	cfg        discovery.Config
	kubeconfig string
	once       bool
}

// parseFlags parses the command line into the agent's configuration.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("ubkit-discovery", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	cfg := &o.cfg
	var gpuDriver, npuDriver, kae, gpuFirmware, npuFirmware, kernel string
	fs.StringVar(&cfg.Scan.Root, "root", "/", "the root of the node's file system (the host's / mounted into the container, such as /host)")
	fs.DurationVar(&cfg.Interval, "interval", discovery.DefaultInterval, "time between full scans")
	fs.DurationVar(&cfg.CheckInterval, "check-interval", discovery.DefaultCheckInterval, "time between checks for devices that came or went (a listing of the device directories; a scan when they changed); 0 turns the check off")
	fs.StringVar(&cfg.FeatureDir, "features-dir", discovery.DefaultFeatureDir, "NFD's features.d directory for the local feature file; empty writes none")
	fs.StringVar(&cfg.FeatureFile, "features-file", discovery.DefaultFeatureFile, "the feature file's name in -features-dir")
	fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's Kubernetes Node name (default $NODE_NAME); empty leaves the cluster alone")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the in-cluster service account, else $KUBECONFIG")
	fs.StringVar(&cfg.Namespace, "namespace", discovery.DefaultNamespace, "namespace of the NodeFeature objects (NFD's)")
	fs.BoolVar(&cfg.DirectLabels, "direct-labels", false, "label the Node directly (only supernode.ubkit.io/ keys), for clusters without NFD")
	fs.StringVar(&gpuDriver, "gpu-driver", "", "expected NVIDIA driver version: V (exactly) or >=V (at least)")
	fs.StringVar(&npuDriver, "npu-driver", "", "expected Ascend driver version: V or >=V")
	fs.StringVar(&kae, "kae-driver", "", "expected KAE driver version: V or >=V")
	fs.StringVar(&gpuFirmware, "gpu-firmware", "", "expected firmware (VBIOS) version of every NVIDIA GPU: V or >=V")
	fs.StringVar(&npuFirmware, "npu-firmware", "", "expected Ascend firmware version: V or >=V")
	fs.StringVar(&kernel, "kernel", "", "expected kernel release (uname -r): V or >=V")
	fs.BoolVar(&o.once, "once", false, "scan and publish once, print the report as JSON and exit")
	if err := fs.Parse(args); err != nil {
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %q\n", fs.Args())
		return nil, errUsage
	}
	if cfg.Interval <= 0 || cfg.CheckInterval < 0 {
		fmt.Fprintln(stderr, "-interval must be positive and -check-interval not negative")
		return nil, errUsage
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = -1 // off; 0 in a Config means the default
	}
	cfg.Scan.Versions = map[discovery.DeviceKind]discovery.VersionPolicy{
		discovery.GPU: policy(gpuDriver), discovery.NPU: policy(npuDriver), discovery.KAE: policy(kae),
	}
	cfg.Scan.Firmware = map[discovery.DeviceKind]discovery.VersionPolicy{
		discovery.GPU: policy(gpuFirmware), discovery.NPU: policy(npuFirmware),
	}
	cfg.Scan.Kernel = policy(kernel)
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	cfg, kubeconfig, once := o.cfg, o.kubeconfig, o.once
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	if cfg.NodeName != "" {
		rc, err := restConfig(kubeconfig)
		if err != nil {
			return err
		}
		rc.UserAgent = "ubkit-discovery"
		if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return err
		}
		if cfg.Dynamic, err = dynamic.NewForConfig(rc); err != nil {
			return err
		}
	}
	agent := discovery.New(cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan os.Signal, 1)
	osproc.NotifyStop(stop)
	defer signal.Stop(stop)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()

	if once {
		r, err := agent.Refresh(ctx)
		if r != nil {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(struct {
				Report   *discovery.Report
				Labels   map[string]string
				Features map[string]string
			}{r, r.Labels(), r.Features()}); jerr != nil && err == nil {
				err = jerr
			}
		}
		return err
	}
	if err := agent.Run(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// policy parses a version flag: "V" is exactly V, ">=V" at least V.
func policy(s string) discovery.VersionPolicy {
	s = strings.TrimSpace(s)
	if v, ok := strings.CutPrefix(s, ">="); ok {
		return discovery.VersionPolicy{Minimum: strings.TrimSpace(v)}
	}
	return discovery.VersionPolicy{Exact: s}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return rest.InClusterConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
}
