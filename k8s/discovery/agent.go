package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// DefaultInterval is how often an Agent scans when Config.Interval is 0.
const DefaultInterval = time.Minute

// DefaultCheckInterval is how often an Agent checks for devices that came
// or went when Config.CheckInterval is 0.
const DefaultCheckInterval = 2 * time.Second

// Config configures an Agent. The zero Config scans "/" every minute and
// whenever a check (every 2 seconds) finds a device that came or went,
// and publishes nothing but log lines.
type Config struct {
	// Scan says where to look and what versions to expect.
	Scan ScanOptions
	// Interval is the time between full scans; 0 means DefaultInterval.
	Interval time.Duration
	// CheckInterval is the time between checks for devices that came or
	// went (0 means DefaultCheckInterval, a negative one checks never):
	// a check lists the directories the scan finds devices in (/dev's
	// davinci* and nvidia*, /sys/class/uacce, /sys/bus/pci/devices, the
	// NVIDIA driver's /proc/driver/nvidia/gpus, the huge page pools and
	// their sizes) and scans at once if their names changed, so a lost
	// device is published within a check interval rather than a scan
	// interval. It polls, as nothing else can: sysfs and procfs report
	// most changes through no inotify event, and ubkit keeps raw system
	// calls out of its adapters.
	CheckInterval time.Duration
	// FeatureDir is the NFD features.d directory to write the local
	// feature file into ("" writes none; DefaultFeatureDir is NFD's),
	// and FeatureFile its name ("" means DefaultFeatureFile).
	FeatureDir, FeatureFile string
	// NodeName is this host's Kubernetes Node; the cluster is not
	// touched without it.
	NodeName string
	// Client and Dynamic reach the cluster; nil publishes nothing there.
	// With Dynamic, a NodeFeature object is published whenever the
	// cluster has NFD's CRD.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace holds the NodeFeature objects; "" means DefaultNamespace.
	Namespace string
	// DirectLabels labels (and annotates) the Node itself (ApplyNode),
	// for clusters without NFD.
	DirectLabels bool
	// Logger gets a line per device that appears or disappears, per
	// device error and per failing check; nil means slog.Default().
	Logger *slog.Logger
}

// Agent scans and publishes. Its methods are safe for concurrent use,
// though Refresh calls run one at a time.
type Agent struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	last      *Report
	published any             // the publication last made (publicationOf), nil if it failed
	errs      map[string]bool // device errors, failing conditions and a changed super node name already logged
}

// New returns an Agent for cfg.
func New(cfg Config) *Agent {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.FeatureFile == "" {
		cfg.FeatureFile = DefaultFeatureFile
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Agent{cfg: cfg, log: log.With("component", "ubkit-discovery")}
}

// Run refreshes at once, then every interval, and also as soon as a check
// (every check interval) finds that a device came or went; it returns
// ctx's error when ctx ends. A failed refresh is logged and retried at the
// next interval.
func (a *Agent) Run(ctx context.Context) error {
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	var check <-chan time.Time
	if a.cfg.CheckInterval > 0 {
		t := time.NewTicker(a.cfg.CheckInterval)
		defer t.Stop()
		check = t.C
	}
	// The state is taken before the scan it stands for, so that a change
	// between the two shows at the next check instead of being missed.
	state := a.deviceState()
	for {
		if _, err := a.Refresh(ctx); err != nil && ctx.Err() == nil {
			a.log.Error("refresh failed", "err", err)
		}
		if err := a.waitForScan(ctx, tick.C, check, &state); err != nil {
			return err
		}
	}
}

// waitForScan returns when the next scan is due: at the next tick, or at
// the first check whose device state differs from *state, which it then
// updates; or with ctx's error when ctx ends.
func (a *Agent) waitForScan(ctx context.Context, tick, check <-chan time.Time, state *string) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			*state = a.deviceState()
			return nil
		case <-check:
			if now := a.deviceState(); now != *state {
				a.log.Debug("device files changed: scanning")
				*state = now
				return nil
			}
		}
	}
}

// deviceState summarises the devices under the scan's root (deviceState),
// "" if the root cannot be read.
func (a *Agent) deviceState() string {
	root := a.cfg.Scan.Root
	if root == "" {
		root = "/"
	}
	return deviceState(os.DirFS(root))
}

// Refresh scans once, logs what changed since the last scan and, if what
// it publishes changed (or the last publication failed), publishes it:
// the feature file, the NodeFeature object if the cluster has NFD, and the
// Node's labels with DirectLabels. The Node's labels are checked at every
// refresh, and put back if someone changed them. It returns the report and every
// publishing error, joined; one that fails does not stop the others. With
// a cluster, no NFD and no DirectLabels, the error is
// ErrNoNodeFeatureCRD.
func (a *Agent) Refresh(ctx context.Context) (*Report, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := Scan(a.cfg.Scan)
	if err != nil {
		return nil, err
	}
	a.logChanges(r)
	a.last = r
	pub := publicationOf(r)
	if a.published != nil && reflect.DeepEqual(pub, a.published) {
		// Nothing new to publish, but the Node's labels are someone
		// else's object too: put back what was changed under us (one
		// read; a patch only if they drifted).
		return r, a.labelNode(ctx, r)
	}
	err = a.publish(ctx, r)
	if err == nil {
		a.published = pub
		a.log.Info("published", "devices", len(r.Devices()), "labels", len(r.Labels()))
	} else {
		a.published = nil
	}
	return r, err
}

// Last returns the report of the latest scan, nil before the first.
func (a *Agent) Last() *Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

func (a *Agent) publish(ctx context.Context, r *Report) error {
	labels := r.Labels()
	var errs []error
	if a.cfg.FeatureDir != "" {
		if err := WriteFeatureFile(a.cfg.FeatureDir, a.cfg.FeatureFile, labels); err != nil {
			errs = append(errs, err)
		}
	}
	if a.cfg.Client != nil && a.cfg.NodeName != "" {
		nfd, err := HasNodeFeatureCRD(a.cfg.Client.Discovery())
		switch {
		case err != nil:
			errs = append(errs, err)
		case nfd && a.cfg.Dynamic != nil:
			if err := PublishNodeFeature(ctx, a.cfg.Dynamic, a.cfg.Namespace, a.cfg.NodeName, r); err != nil {
				errs = append(errs, err)
			}
		case !nfd && !a.cfg.DirectLabels:
			errs = append(errs, ErrNoNodeFeatureCRD)
		}
		if err := a.labelNode(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// labelNode applies r's labels and annotations to the Node with
// DirectLabels.
func (a *Agent) labelNode(ctx context.Context, r *Report) error {
	if !a.cfg.DirectLabels || a.cfg.Client == nil || a.cfg.NodeName == "" {
		return nil
	}
	labels, annotations, err := ApplyNode(ctx, a.cfg.Client, a.cfg.NodeName, r.Labels(), r.Annotations())
	for _, k := range labels {
		a.log.Info("label removed", "node", a.cfg.NodeName, "label", k)
	}
	for _, k := range annotations {
		a.log.Info("annotation removed", "node", a.cfg.NodeName, "annotation", k)
	}
	return err
}

// logChanges logs devices that appeared or disappeared since the last
// scan, and device errors and failing checks the first time they are seen.
func (a *Agent) logChanges(r *Report) {
	now := r.Devices()
	if a.last != nil {
		before := a.last.Devices()
		for _, d := range before {
			if !slices.Contains(now, d) {
				a.log.Warn("device disappeared", "device", d)
			}
		}
		for _, d := range now {
			if !slices.Contains(before, d) {
				a.log.Info("device appeared", "device", d)
			}
		}
	} else {
		a.log.Info("devices found", "devices", now, "supernode", r.SuperNode, "node", r.Node)
	}
	seen := map[string]bool{}
	if id := r.SuperNodeID(); id != r.SuperNode && id != "" {
		msg := "id " + r.SuperNode + " " + id
		seen[msg] = true
		if !a.errs[msg] {
			a.log.Warn("super node name changed to name a SuperNode", "supernode", r.SuperNode, "label", LabelSuperNode+"="+id)
		}
	}
	for _, e := range r.Errors {
		msg := e.Error()
		seen[msg] = true
		if !a.errs[msg] {
			a.log.Warn("device unreadable", "err", msg)
		}
	}
	for _, c := range r.Conditions {
		if c.Status == ConditionTrue {
			continue
		}
		msg := fmt.Sprintf("%s %s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		seen[msg] = true
		if !a.errs[msg] {
			a.log.Warn("check failed", "type", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
		}
	}
	a.errs = seen
}
