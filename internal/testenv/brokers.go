package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The brokers that prereqs.sh resolves from Maven Central (keep them in
// step with pulsar_version and rocketmq_version there).
const (
	PulsarVersion   = "4.0.7"
	RocketMQVersion = "5.5.0"
)

// brokerStartTimeout bounds a broker's start: a cold JVM on a loaded
// two-core machine. A broker that is ready sooner is used at once.
const brokerStartTimeout = 3 * time.Minute

// BrokerOptions configure StartPulsar and StartRocketMQ.
type BrokerOptions struct {
	// Durable makes the broker sync what it stores before it
	// acknowledges it: Pulsar's journalSyncData=true, RocketMQ's
	// flushDiskType=SYNC_FLUSH. Without it (the default, quicker) an
	// acknowledged message may be lost in a crash of the machine; a
	// SIGKILL of the broker alone loses nothing the page cache holds.
	Durable bool
}

// Pulsar is a Pulsar standalone (broker, embedded bookie, RocksDB
// metadata store) on free loopback ports.
type Pulsar struct {
	// ServiceURL is pulsar://127.0.0.1:port for clients; WebURL
	// http://127.0.0.1:port for the admin API.
	ServiceURL, WebURL string
	t                  testing.TB
	dir                string
	brokerPort         int
	webPort            int
	opts               BrokerOptions
	proc               *javaProc
	probes             int // the number in the next probe topic's name
}

// StartPulsar starts Pulsar standalone PulsarVersion from the jars
// prereqs.sh resolved, in a fresh directory, and waits until its health
// check answers. t.Cleanup kills it; it also dies with the test process.
// It takes 10–30 s and about 450 MB.
func StartPulsar(t testing.TB, opts BrokerOptions) *Pulsar {
	t.Helper()
	java, lib := javaAndLib(t, "pulsar", PulsarVersion, "pulsar-broker-"+PulsarVersion+".jar")
	var lastErr error
	for range 3 { // a port another process took meanwhile: try others
		p := &Pulsar{t: t, dir: brokerDir(t, "pulsar"), opts: opts}
		var err error
		if p.brokerPort, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if p.webPort, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if p.brokerPort == p.webPort {
			continue
		}
		p.ServiceURL = "pulsar://127.0.0.1:" + strconv.Itoa(p.brokerPort)
		p.WebURL = "http://127.0.0.1:" + strconv.Itoa(p.webPort)
		if lastErr = p.start(java, lib); lastErr == nil {
			t.Cleanup(func() {
				p.Stop(false)
				if t.Failed() {
					t.Logf("the test failed; Pulsar's warnings and errors: %s", p.proc.problems())
				}
			})
			return p
		}
	}
	t.Fatal(lastErr)
	return nil
}

// Pid is the broker's process id.
func (p *Pulsar) Pid() int { return p.proc.cmd.Process.Pid }

// Dir is the broker's working directory: its configuration, data and
// log (pulsar.log).
func (p *Pulsar) Dir() string { return p.dir }

// Stop stops the broker: with SIGTERM when graceful (up to 30 s, then
// SIGKILL), else with SIGKILL, a crash. Its data stays for Restart.
func (p *Pulsar) Stop(graceful bool) { p.proc.stop(graceful) }

// Restart stops the broker as Stop does and starts it again on the same
// data and ports, waiting until it is ready (about 2 s longer than a
// start: see dropDeadBookie). It fails the test if it cannot.
func (p *Pulsar) Restart(graceful bool) {
	p.t.Helper()
	p.Stop(graceful)
	java, lib := javaAndLib(p.t, "pulsar", PulsarVersion, "pulsar-broker-"+PulsarVersion+".jar")
	if err := p.start(java, lib); err != nil {
		p.t.Fatal(err)
	}
}

func (p *Pulsar) start(java, lib string) error {
	conf := filepath.Join(p.dir, "standalone.conf")
	if err := os.WriteFile(conf, []byte(p.config()), 0o600); err != nil {
		return err
	}
	metadata := filepath.Join(p.dir, "data", "metadata")
	if _, err := os.Stat(metadata); err == nil {
		if err := p.dropDeadBookie(java, lib, metadata); err != nil {
			return err
		}
	}
	args := []string{"-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m", "-Djava.net.preferIPv4Stack=true"}
	for _, o := range []string{"java.base/java.lang", "java.base/java.nio", "java.base/sun.net", "java.base/jdk.internal.misc",
		"java.management/sun.management", "jdk.management/com.sun.management.internal"} {
		args = append(args, "--add-opens", o+"=ALL-UNNAMED")
	}
	args = append(args, "-cp", filepath.Join(lib, "*"), "org.apache.pulsar.PulsarStandaloneStarter",
		"--config", conf,
		"--metadata-dir", metadata,
		"--bookkeeper-dir", filepath.Join(p.dir, "data", "bookkeeper"),
		"--no-functions-worker", "--no-stream-storage")
	// The working directory is the test's own: with a
	// ./data/standalone/zookeeper there Pulsar would run ZooKeeper.
	logStart := fileSize(filepath.Join(p.dir, "pulsar.log"))
	proc, err := startJava(java, p.dir, "pulsar", args, "")
	if err != nil {
		return err
	}
	p.proc = proc
	if err := p.waitHealthy(); err != nil {
		proc.stop(false)
		return err
	}
	if line := bookieFlapping(proc.log, logStart); line != "" {
		proc.stop(false)
		return fmt.Errorf("testenv: Pulsar's bookie keeps deleting and re-creating its registration, so ledger creations fail at moments with \"Not enough non-faulty bookies\" (%s): %s", line, proc.log)
	}
	return nil
}

// dropDeadBookie removes, before a start on existing data, the
// registration that a killed standalone's bookie left in the metadata
// store (an ephemeral node the RocksDB store keeps over the crash).
//
// The store removes such a node only lazily, when it is next read. Read
// first by the new bookie as it registers, the node goes, the bookie's
// registration lock takes the path again, and the store's notification
// of the removal can reach that lock after it is held: the lock then
// revalidates itself and, as BookieServiceInfo has no equals, deletes and
// re-creates its node, whose deletion notifies it again. The bookie's
// registration then flaps until the process ends (thousands of "Lock on
// resource /ledgers/available/... was invalidated" a second), and a
// ledger creation that the broker attempts while its list of bookies is
// empty fails with "Not enough non-faulty bookies available". It happened
// in about one crash restart in four.
//
// Listing the writable bookies with BookKeeper's shell while no bookie
// runs reads the node, and so removes it, before the bookie registers.
func (p *Pulsar) dropDeadBookie(java, lib, metadata string) error {
	conf := filepath.Join(p.dir, "bookkeeper-shell.conf")
	if err := os.WriteFile(conf, []byte("metadataServiceUri=metadata-store:rocksdb://"+metadata+"\n"), 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), brokerStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, java, "-Xmx128m",
		"-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver",
		"-cp", filepath.Join(lib, "*"), "org.apache.bookkeeper.bookie.BookieShell", "-conf", conf, "listbookies", "-rw")
	cmd.Dir = p.dir
	osproc.DieWithParent(cmd)
	out, err := cmd.CombinedOutput()
	logPath := filepath.Join(p.dir, "bookkeeper-shell.log")
	os.WriteFile(logPath, out, 0o600)
	// The shell exits 0 even when it cannot open the store: it did its
	// work when it says that no writable bookie is registered.
	if err != nil || !bytes.Contains(out, []byte("No bookie exists!")) {
		if len(out) > 4000 {
			out = out[len(out)-4000:]
		}
		return fmt.Errorf("testenv: BookKeeper's shell did not clear the killed bookie's registration (%v): %s:\n%s", err, logPath, bytes.TrimSpace(out))
	}
	return nil
}

// bookieFlapping is the first line of log from offset from on that shows
// the bookie's registration lock revalidating itself, the loop
// dropDeadBookie avoids, or "".
func bookieFlapping(log string, from int64) string {
	b, _ := os.ReadFile(log)
	if from > int64(len(b)) {
		from = 0
	}
	for line := range strings.Lines(string(b[from:])) {
		if strings.Contains(line, "Lock on resource /ledgers/available/") && strings.Contains(line, "was invalidated") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (p *Pulsar) config() string {
	return fmt.Sprintf(`clusterName=standalone
advertisedAddress=127.0.0.1
bindAddress=127.0.0.1
brokerServicePort=%d
webServicePort=%d
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
loadManagerClassName=org.apache.pulsar.broker.loadbalance.NoopLoadManager
loadBalancerEnabled=false
functionsWorkerEnabled=false
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
brokerDeleteInactiveTopicsEnabled=false
managedLedgerCacheSizeMB=32
dbStorage_writeCacheMaxSizeMb=32
dbStorage_readAheadCacheMaxSizeMb=32
dbStorage_rocksDB_blockCacheSize=16777216
journalSyncData=%t
`, p.brokerPort, p.webPort, p.opts.Durable)
}

// waitHealthy polls, in turn, the health check until it answers 200
// (Pulsar says nothing on its output when it is ready), the namespace
// public/default until it exists (standalone makes it after the broker
// answers healthy: a client in between got TopicNotFound), and the
// creation of a topic until it succeeds (a topic's ledger needs the
// bookie, which can register later still: a client in between got "Not
// enough non-faulty bookies"), or until the broker exits. The probe topic
// is a new one each time: one that exists (an earlier start's, or one an
// attempt whose ledger failed left) answers 409 without a ledger.
func (p *Pulsar) waitHealthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), brokerStartTimeout)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	type step struct {
		method, url string
		ok          []int
	}
	steps := []step{
		{http.MethodGet, p.WebURL + "/admin/v2/brokers/health", []int{http.StatusOK}},
		{http.MethodGet, p.WebURL + "/admin/v2/namespaces/public/default", []int{http.StatusOK}},
		{http.MethodPut, "", []int{http.StatusNoContent}},
	}
	probe := func() string {
		p.probes++
		return p.WebURL + "/admin/v2/persistent/public/default/testenv-ready-" + strconv.Itoa(p.probes)
	}
	url := steps[0].url
	var last string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, steps[0].method, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if slices.Contains(steps[0].ok, resp.StatusCode) {
				if steps = steps[1:]; len(steps) == 0 {
					return nil
				}
				if url = steps[0].url; url == "" {
					url = probe()
				}
				continue
			}
			if resp.StatusCode == http.StatusConflict && steps[0].url == "" {
				url = probe()
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-p.proc.exited:
			return fmt.Errorf("testenv: Pulsar exited before it was ready (%s): %s", p.proc.cmd.ProcessState, p.proc.tail())
		case <-ctx.Done():
			return fmt.Errorf("testenv: Pulsar's %s did not answer 200 within %v (last: %s): %s", url, brokerStartTimeout, last, p.proc.tail())
		case <-tick.C:
		}
	}
}

// RocketMQ is a RocketMQ name server and one broker (a master) on free
// loopback ports.
type RocketMQ struct {
	// NamesrvAddr is the name server's host:port, what clients are
	// given; BrokerAddr the broker's.
	NamesrvAddr, BrokerAddr string
	t                       testing.TB
	dir                     string
	namesrvPort, brokerPort int
	opts                    BrokerOptions
	namesrv, broker         *javaProc
}

// StartRocketMQ starts a RocketMQ RocketMQVersion name server and broker
// from the jars prereqs.sh resolved, in a fresh directory, and waits until
// each says "boot success". t.Cleanup kills them; they also die with the
// test process. It takes 5–20 s and about 650 MB.
func StartRocketMQ(t testing.TB, opts BrokerOptions) *RocketMQ {
	t.Helper()
	java, lib := javaAndLib(t, "rocketmq", RocketMQVersion, "rocketmq-broker-"+RocketMQVersion+".jar")
	var lastErr error
	for range 3 {
		r := &RocketMQ{t: t, dir: brokerDir(t, "rocketmq"), opts: opts}
		var err error
		if r.namesrvPort, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if r.brokerPort, err = freeBrokerPort(r.namesrvPort); err != nil {
			t.Fatal(err)
		}
		r.NamesrvAddr = "127.0.0.1:" + strconv.Itoa(r.namesrvPort)
		r.BrokerAddr = "127.0.0.1:" + strconv.Itoa(r.brokerPort)
		if lastErr = r.start(java, lib); lastErr == nil {
			t.Cleanup(func() {
				r.Stop(false)
				if t.Failed() {
					t.Logf("the test failed; the RocketMQ broker's warnings and errors: %s", r.broker.problems())
				}
			})
			return r
		}
	}
	t.Fatal(lastErr)
	return nil
}

// freeBrokerPort finds a port p for a RocketMQ broker such that p-2 (its
// fast remoting port) and p+1 (HA, on all addresses) are free too, and
// none is avoid.
func freeBrokerPort(avoid int) (int, error) {
	for range 100 {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if p-2 <= 1024 || p+1 > 65535 || p == avoid || p-2 == avoid || p+1 == avoid {
			continue
		}
		if portFree("127.0.0.1", p-2) && portFree("", p+1) {
			return p, nil
		}
	}
	return 0, errors.New("testenv: no free port p for the RocketMQ broker with p-2 and p+1 free")
}

func portFree(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Pids are the name server's and the broker's process ids.
func (r *RocketMQ) Pids() (namesrv, broker int) {
	return r.namesrv.cmd.Process.Pid, r.broker.cmd.Process.Pid
}

// Dir is the working directory of both: configurations, the store
// (store/), logs (namesrv.log, broker.log).
func (r *RocketMQ) Dir() string { return r.dir }

// Stop stops the broker, then the name server, as Pulsar.Stop does.
func (r *RocketMQ) Stop(graceful bool) {
	if r.broker != nil {
		r.broker.stop(graceful)
	}
	if r.namesrv != nil {
		r.namesrv.stop(graceful)
	}
}

// Restart stops both as Stop does and starts them again on the same store
// and ports, waiting until both are ready. It fails the test if it cannot.
func (r *RocketMQ) Restart(graceful bool) {
	r.t.Helper()
	r.Stop(graceful)
	java, lib := javaAndLib(r.t, "rocketmq", RocketMQVersion, "rocketmq-broker-"+RocketMQVersion+".jar")
	if err := r.start(java, lib); err != nil {
		r.t.Fatal(err)
	}
}

func (r *RocketMQ) start(java, lib string) error {
	flush := "ASYNC_FLUSH"
	if r.opts.Durable {
		flush = "SYNC_FLUSH"
	}
	store := filepath.Join(r.dir, "store")
	// notifyConsumerIdsChangedEnable=false: consumers rebalance when they
	// start and every 20 s, not also when the broker tells them their
	// group changed. rocketmq-client-go's Shutdown writes a plain bool
	// that every rebalance reads, and the rebalance Start runs in a
	// goroutine waits behind a notified one: a consumer shut down after
	// the notified rebalance, before Start's, was a data race inside the
	// client that a make test reported. Tests wait for Start's rebalance
	// before Shutdown (ubrocketmq's consume), which only works when it is
	// the first.
	files := map[string]string{
		"namesrv.conf": fmt.Sprintf("listenPort=%d\nbindAddress=127.0.0.1\n", r.namesrvPort),
		"broker.conf": fmt.Sprintf(`brokerClusterName=ubkit
brokerName=broker-a
brokerId=0
brokerRole=ASYNC_MASTER
flushDiskType=%s
namesrvAddr=%s
brokerIP1=127.0.0.1
bindAddress=127.0.0.1
listenPort=%d
storePathRootDir=%s
storePathCommitLog=%s
autoCreateTopicEnable=true
notifyConsumerIdsChangedEnable=false
autoCreateSubscriptionGroup=true
mappedFileSizeCommitLog=16777216
mappedFileSizeConsumeQueue=600000
maxHashSlotNum=10000
maxIndexNum=40000
`, flush, r.NamesrvAddr, r.brokerPort, store, filepath.Join(store, "commitlog")),
		// Both share one classpath: without their own configuration the
		// name server would pick the broker's and log its status.
		"logback.xml": `<configuration>
  <appender name="console" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="console"/></root>
</configuration>
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	common := []string{"-Drocketmq.home.dir=" + r.dir, "-Duser.home=" + r.dir,
		"-Drmq.logback.configurationFile=" + filepath.Join(r.dir, "logback.xml"), "-cp", filepath.Join(lib, "*")}
	var err error
	r.namesrv, err = startJava(java, r.dir, "namesrv", append(append([]string{"-Xms128m", "-Xmx256m"}, common...),
		"org.apache.rocketmq.namesrv.NamesrvStartup", "-c", filepath.Join(r.dir, "namesrv.conf")), "boot success")
	if err != nil {
		return err
	}
	if err := r.namesrv.waitReady("RocketMQ name server"); err != nil {
		r.namesrv.stop(false)
		return err
	}
	r.broker, err = startJava(java, r.dir, "broker", append(append([]string{"-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m"}, common...),
		"org.apache.rocketmq.broker.BrokerStartup", "-c", filepath.Join(r.dir, "broker.conf")), "boot success")
	if err == nil {
		if err = r.broker.waitReady("RocketMQ broker"); err != nil {
			r.broker.stop(false)
		}
	}
	if err != nil {
		r.namesrv.stop(false)
		return err
	}
	return nil
}

// brokerDirPrefix starts the names of the brokers' directories, under
// os.TempDir(): <prefix><pid of the test process>-<broker>-<random>.
const brokerDirPrefix = "ubkit-broker-"

// brokerDir makes a fresh directory for a broker, removed by t.Cleanup
// after the broker stopped. It first removes those that test processes
// killed before their cleanup left (their brokers died with them).
func brokerDir(t testing.TB, broker string) string {
	t.Helper()
	stale, _ := filepath.Glob(filepath.Join(os.TempDir(), brokerDirPrefix+"*"))
	for _, d := range stale {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), brokerDirPrefix), "-")
		if pid, err := strconv.Atoi(pidText); err == nil && pid > 0 && pid != os.Getpid() && !pidAlive(pid) {
			os.RemoveAll(d)
		}
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-%s-", brokerDirPrefix, os.Getpid(), broker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// javaAndLib finds java and the lib directory of broker version, or
// fails the test saying how to get them.
func javaAndLib(t testing.TB, broker, version, marker string) (java, lib string) {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatal("testenv: java is missing: install Java 17 (the Debian package openjdk-17-jre-headless; make prereqs does)")
	}
	cache, err := cacheDir()
	if err != nil {
		t.Fatal(err)
	}
	lib = filepath.Join(cache, broker+"-"+version, "lib")
	if _, err := os.Stat(filepath.Join(lib, marker)); err != nil {
		t.Fatalf("testenv: the %s %s jars are not in %s: run make prereqs (internal/testenv/prereqs.sh resolves them from Maven Central) with UBKIT_CACHE=%s",
			broker, version, lib, cache)
	}
	return java, lib
}

// cacheDir is $UBKIT_CACHE, or the module root's .cache, prereqs.sh's
// default.
func cacheDir() (string, error) {
	if cache := os.Getenv("UBKIT_CACHE"); cache != "" {
		return cache, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("testenv: UBKIT_CACHE is not set and %w", err)
	}
	return filepath.Join(root, ".cache"), nil
}

// javaProc is a JVM that testenv started, its output going to
// <dir>/<name>.log.
type javaProc struct {
	cmd     *exec.Cmd
	log     string
	ready   chan struct{} // closed when the marker line is out
	exited  chan struct{} // closed once it exited and its output is read
	stopped sync.Once
}

// startJava starts java with args in dir. Once a line of its output
// contains marker (if not empty), ready is closed.
func startJava(java, dir, name string, args []string, marker string) (*javaProc, error) {
	p := &javaProc{log: filepath.Join(dir, name+".log"), ready: make(chan struct{}), exited: make(chan struct{})}
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	p.cmd = exec.Command(java, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = w, w
	// The broker dies with the process that started it, even one killed
	// before it could stop the broker.
	osproc.DieWithParent(p.cmd)
	err = p.cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		logFile.Close()
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.Close()
		defer logFile.Close()
		br := bufio.NewReader(r)
		seen := false
		for {
			line, err := br.ReadString('\n')
			logFile.WriteString(line)
			if !seen && marker != "" && strings.Contains(line, marker) {
				seen = true
				close(p.ready)
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		p.cmd.Wait()
		<-done
		close(p.exited)
	}()
	return p, nil
}

// waitReady waits for the marker line, or the process's exit.
func (p *javaProc) waitReady(what string) error {
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return fmt.Errorf("testenv: %s exited before it was ready (%s): %s", what, p.cmd.ProcessState, p.tail())
	case <-time.After(brokerStartTimeout):
		return fmt.Errorf("testenv: %s did not say it was ready within %v: %s", what, brokerStartTimeout, p.tail())
	}
}

// stop ends the process by its pid and waits for it.
func (p *javaProc) stop(graceful bool) {
	p.stopped.Do(func() {
		if graceful {
			osproc.Terminate(p.cmd.Process)
			select {
			case <-p.exited:
				return
			case <-time.After(30 * time.Second):
			}
		}
		p.cmd.Process.Kill()
		<-p.exited
	})
}

// problems is the last 60 lines of the process's output that say WARN or
// ERROR (with the stack lines after them), for a failed test: its data
// directory is removed after the test.
func (p *javaProc) problems() string {
	b, _ := os.ReadFile(p.log)
	var keep []string
	inProblem := false
	for line := range strings.Lines(string(b)) {
		switch {
		case strings.Contains(line, "WARN") || strings.Contains(line, "ERROR"):
			inProblem = true
		case strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "Caused by"):
		default:
			inProblem = false
		}
		if inProblem {
			keep = append(keep, strings.TrimRight(line, "\n"))
		}
	}
	keep = keep[max(0, len(keep)-60):]
	return fmt.Sprintf("%s:\n%s", p.log, strings.Join(keep, "\n"))
}

// tail is the end of the process's output, for errors.
func (p *javaProc) tail() string {
	b, _ := os.ReadFile(p.log)
	const limit = 4000
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return fmt.Sprintf("%s:\n%s", p.log, strings.TrimSpace(string(b)))
}
