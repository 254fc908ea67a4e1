package k8stest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Config says which parts of the control plane [Start] runs. etcd and
// kube-apiserver always run; the zero Config runs nothing else.
type Config struct {
	// ControllerManager runs kube-controller-manager: Deployments make
	// ReplicaSets and pods, namespaces get their default service
	// account, nodes that stop reporting are tainted and their pods
	// evicted.
	ControllerManager bool
	// Scheduler runs kube-scheduler, which binds pods to nodes.
	Scheduler bool
	// Kwok runs kwok, which keeps the nodes [Cluster.AddNodes] makes
	// Ready and runs their pods (it marks them Running); AddNodes needs
	// it.
	Kwok bool
	// BinDir holds the binaries; "" means [DefaultBinDir].
	BinDir string
	// StartTimeout bounds the wait for each process to become healthy;
	// 0 means 2 minutes (a loaded machine can take that long).
	StartTimeout time.Duration
	// APIServerArgs are extra kube-apiserver flags (such as
	// --feature-gates=...); a flag given here overrides k8stest's own.
	APIServerArgs []string
}

// Cluster is a running control plane. Its methods are safe for
// concurrent use.
type Cluster struct {
	dir        string
	host       string
	pki        *pki
	admin      *rest.Config
	client     kubernetes.Interface
	kubeconfig string
	// What runs besides etcd and the apiserver.
	controllerManager, kwok bool

	// stops stop the processes, in the order of starting; removeDir
	// says whether Close removes dir (Start's test does it itself).
	mu        sync.Mutex
	stops     []func()
	procs     []*process
	removeDir bool
}

// The service range of the cluster, and the pod range kwok assigns from
// (kwok's default overlaps the service range).
const (
	serviceCIDR = "10.0.0.0/24"
	podCIDR     = "10.244.0.0/16"
)

// Start starts a control plane as cfg says and returns it; t's cleanup
// stops every process, last started first, and removes their files. It
// fails t if a binary is missing (naming it) or a process does not become
// healthy (printing the end of its log).
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	var c *Cluster
	t.Cleanup(func() {
		if c != nil {
			c.Close()
		}
	})
	err := startRetrying(t.Context(), cfg, func() (*Cluster, error) {
		c = &Cluster{dir: t.TempDir()}
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// choosePorts chooses a cluster's ports; a test replaces it.
var choosePorts = freePorts

// startTries bounds the attempts to start a control plane whose ports
// another process took between freePorts and the bind.
const startTries = 3

// startRetrying starts a cluster that next makes (each attempt in a
// directory of its own), and again, on new ports, when a process could
// not bind its port: ports are free when chosen, and another test or
// program may take one before the process binds it. A failed attempt is
// stopped (and its files removed where next made them so).
func startRetrying(ctx context.Context, cfg Config, next func() (*Cluster, error)) error {
	for try := 1; ; try++ {
		c, err := next()
		if err != nil {
			return err
		}
		err = c.start(ctx, cfg)
		if err == nil {
			return nil
		}
		c.Close()
		if try == startTries || !errors.Is(err, errPortTaken) || ctx.Err() != nil {
			return err
		}
	}
}

// StartControlPlane is [Start] for programs, such as a demo or a
// benchmark, that are not tests: it starts a control plane as cfg says,
// its files in a new temporary directory, and returns it. The caller
// stops it with [Cluster.Close]. If it fails, whatever it started is
// stopped and removed.
func StartControlPlane(ctx context.Context, cfg Config) (*Cluster, error) {
	var c *Cluster
	err := startRetrying(ctx, cfg, func() (*Cluster, error) {
		dir, err := os.MkdirTemp("", "k8stest-")
		if err != nil {
			return nil, err
		}
		c = &Cluster{dir: dir, removeDir: true}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops every process of the cluster, last started first, and
// removes its files ([StartControlPlane]'s; [Start]'s test removes its
// own). It is safe to call more than once; Start's cleanup calls it.
func (c *Cluster) Close() error {
	c.mu.Lock()
	stops := c.stops
	c.stops = nil
	c.mu.Unlock()
	// The reverse of the order of starting, as the apiserver hangs
	// without its etcd.
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	if c.removeDir {
		return os.RemoveAll(c.dir)
	}
	return nil
}

func (c *Cluster) start(ctx context.Context, cfg Config) error {
	root := cfg.BinDir
	if root == "" {
		var err error
		if root, err = DefaultBinDir(); err != nil {
			return err
		}
	}
	bins := findBinaries(root)
	needed := []struct{ what, path string }{{"etcd " + EtcdVersion, bins.etcd}, {"kube-apiserver " + KubernetesVersion, bins.apiserver}}
	if cfg.ControllerManager {
		needed = append(needed, struct{ what, path string }{"kube-controller-manager " + KubernetesVersion, bins.controllerManager})
	}
	if cfg.Scheduler {
		needed = append(needed, struct{ what, path string }{"kube-scheduler " + KubernetesVersion, bins.scheduler})
	}
	if cfg.Kwok {
		needed = append(needed, struct{ what, path string }{"kwok " + KwokVersion, bins.kwok})
	}
	for _, n := range needed {
		if err := need(n.what, n.path); err != nil {
			return err
		}
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	dir := c.dir
	p, err := newPKI(dir)
	if err != nil {
		return fmt.Errorf("k8stest: make the test certificates: %w", err)
	}
	ports, err := choosePorts(6)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort, cmPort, schedPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	c.host, c.pki, c.controllerManager, c.kwok = "https://"+hostPort(apiPort), p, cfg.ControllerManager, cfg.Kwok

	run := func(name, bin string, args []string) (*process, error) {
		proc, err := startProcess(name, bin, dir, args)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.stops = append(c.stops, proc.stop)
		c.procs = append(c.procs, proc)
		c.mu.Unlock()
		return proc, nil
	}

	etcdURL := "http://" + hostPort(etcdPort)
	peerURL := "http://" + hostPort(peerPort)
	// A name of this cluster's own: the etcd that answers on etcdPort
	// must be this one, not another test's that took the port.
	etcdName := "k8stest-" + rand.Text()[:16]
	etcd, err := run("etcd", bins.etcd, []string{
		"--name=" + etcdName,
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=" + etcdName + "=" + peerURL,
		"--listen-metrics-urls=http://127.0.0.1:0",
		// A test's data need not survive a crash of the machine.
		"--unsafe-no-fsync=true",
	})
	if err != nil {
		return err
	}
	if err := etcd.waitHealthy(ctx, healthClient(nil, nil, false), etcdURL+"/health", timeout); err != nil {
		return err
	}
	if err := etcd.checkEtcdName(ctx, etcdURL, etcdName); err != nil {
		return err
	}

	admin, err := p.client("k8stest-admin", "system:masters")
	if err != nil {
		return err
	}
	adminTLS, err := tls.X509KeyPair(admin.certPEM, admin.keyPEM)
	if err != nil {
		return err
	}
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// A loopback advertise address is refused unless nothing
		// reconciles the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + p.servingCert, "--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saKey, "--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
	}
	apiserver, err := run("kube-apiserver", bins.apiserver, append(apiArgs, cfg.APIServerArgs...))
	if err != nil {
		return err
	}
	if err := apiserver.waitHealthy(ctx, healthClient(p.caPEM(), &adminTLS, false), c.host+"/readyz", timeout); err != nil {
		return err
	}
	c.admin = c.config(admin)
	if c.client, err = kubernetes.NewForConfig(c.admin); err != nil {
		return err
	}
	if c.kubeconfig, err = c.writeKubeconfig("admin", admin); err != nil {
		return err
	}

	if cfg.ControllerManager {
		kc, err := c.componentKubeconfig("system:kube-controller-manager")
		if err != nil {
			return err
		}
		cm, err := run("kube-controller-manager", bins.controllerManager, []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(cmPort),
			"--cert-dir=" + filepath.Join(dir, "controller-manager-certs"),
			"--leader-elect=false",
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + p.saKey,
			"--root-ca-file=" + p.caFile,
			"--cluster-signing-cert-file=" + p.caFile, "--cluster-signing-key-file=" + p.caKeyFile,
			"--service-cluster-ip-range=" + serviceCIDR,
			// The default 20/s takes minutes over a few thousand nodes.
			"--kube-api-qps=200", "--kube-api-burst=400",
		})
		if err != nil {
			return err
		}
		// kube-controller-manager has /healthz, not /readyz.
		if err := cm.waitHealthy(ctx, healthClient(nil, nil, true), "https://"+hostPort(cmPort)+"/healthz", timeout); err != nil {
			return err
		}
	}
	if cfg.Scheduler {
		kc, err := c.componentKubeconfig("system:kube-scheduler")
		if err != nil {
			return err
		}
		sched, err := run("kube-scheduler", bins.scheduler, []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(schedPort),
			"--cert-dir=" + filepath.Join(dir, "scheduler-certs"),
			"--leader-elect=false",
		})
		if err != nil {
			return err
		}
		if err := sched.waitHealthy(ctx, healthClient(nil, nil, true), "https://"+hostPort(schedPort)+"/healthz", timeout); err != nil {
			return err
		}
	}
	if cfg.Kwok {
		stages, err := filepath.Glob(filepath.Join(bins.stages, "*.yaml"))
		if err != nil || len(stages) == 0 {
			return errMissing("kwok's stages", filepath.Join(bins.stages, "*.yaml"), fs.ErrNotExist)
		}
		kwok, err := run("kwok", bins.kwok, []string{
			"--kubeconfig=" + c.kubeconfig,
			"--manage-all-nodes=false",
			"--manage-nodes-with-annotation-selector=" + kwokNodeAnnotation + "=fake",
			"--config=" + strings.Join(stages, ","),
			"--node-lease-duration-seconds=40",
			// kwok's default pod range overlaps the service range.
			"--cidr=" + podCIDR,
			"--server-address=" + hostPort(kwokPort),
		})
		if err != nil {
			return err
		}
		if err := kwok.waitHealthy(ctx, healthClient(nil, nil, false), "http://"+hostPort(kwokPort)+"/healthz", timeout); err != nil {
			return err
		}
	}
	// A process that could not bind its port may have exited after
	// another program's server answered its health check.
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, p := range procs {
		if err := p.running(); err != nil {
			return err
		}
	}
	return nil
}

// RESTConfig returns a configuration of a client that the apiserver
// authenticates as k8stest-admin in group system:masters: allowed
// everything. Each call returns a new copy.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Client returns a clientset for the administrator of RESTConfig.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// UserConfig returns a configuration of a client that the apiserver
// authenticates as user in groups (a client certificate the cluster's CA
// signed), for tests of what RBAC lets someone do. Every authenticated
// user is also in system:authenticated.
func (c *Cluster) UserConfig(user string, groups ...string) (*rest.Config, error) {
	cert, err := c.pki.client(user, groups...)
	if err != nil {
		return nil, err
	}
	return c.config(cert), nil
}

// Kubeconfig returns the path of a kubeconfig file for the administrator,
// for programs such as kubectl. It is removed with the cluster.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// Host is the apiserver's URL (https://127.0.0.1:port).
func (c *Cluster) Host() string { return c.host }

// Dir is the directory of the cluster's files: certificates, kubeconfigs,
// etcd's data and each process's log (<name>.log). It is removed with the
// cluster.
func (c *Cluster) Dir() string { return c.dir }

func (c *Cluster) config(cert clientCert) *rest.Config {
	return &rest.Config{
		Host: c.host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caPEM(),
			CertData: cert.certPEM,
			KeyData:  cert.keyPEM,
		},
		// The client-go defaults (5/s, burst 10) throttle a test that
		// makes hundreds of objects.
		QPS:   200,
		Burst: 400,
	}
}

// componentKubeconfig writes a kubeconfig for a control-plane component
// that authenticates as user (bootstrap RBAC gives it its rights).
func (c *Cluster) componentKubeconfig(user string) (string, error) {
	cert, err := c.pki.client(user)
	if err != nil {
		return "", err
	}
	return c.writeKubeconfig(strings.TrimPrefix(user, "system:"), cert)
}

func (c *Cluster) writeKubeconfig(name string, cert clientCert) (string, error) {
	b64 := base64.StdEncoding.EncodeToString
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: k8stest
  context:
    cluster: k8stest
    user: %s
current-context: k8stest
`, c.host, b64(c.pki.caPEM()), name, b64(cert.certPEM), b64(cert.keyPEM), name)
	path := filepath.Join(c.dir, name+".kubeconfig")
	return path, os.WriteFile(path, []byte(text), 0o600)
}

func newCertPool(caPEM []byte) *x509.CertPool {
	if caPEM == nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return pool
}
