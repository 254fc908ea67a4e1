package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	testenv.Main(m)
}

func TestBenchJSON(t *testing.T) {
	var out bytes.Buffer
	err := benchCmd([]string{"shm", "-case", "stream-64B", "-rounds", "1", "-duration", "30ms", "-json", "-no-shmipc"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Suite   string `json:"suite"`
		Results []struct {
			Case      string             `json:"case"`
			Unit      string             `json:"unit"`
			Better    string             `json:"better"`
			Value     float64            `json:"value"`
			Baselines map[string]float64 `json:"baselines"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if rep.Suite != "shm" || len(rep.Results) != 1 {
		t.Fatalf("report %s", out.String())
	}
	r := rep.Results[0]
	if r.Case != "stream-64B" || r.Unit != "msg/s" || r.Better != "higher" || r.Value <= 0 || r.Baselines["uds"] <= 0 || r.Baselines["tcp"] <= 0 {
		t.Fatalf("row %+v", r)
	}
}

// TestSelectCases: -case names a case, or a group of them by the prefix
// before a slash.
func TestSelectCases(t *testing.T) {
	var cases []bench.Case
	for _, n := range []string{"echo-64B", "connect-close-1000/shm/fds", "connect-close-1000/ub/rss", "connect-close-10000/shm/fds"} {
		cases = append(cases, bench.Case{Name: n})
	}
	for only, want := range map[string]string{
		"echo-64B":                  "echo-64B",
		"connect-close-1000":        "connect-close-1000/shm/fds connect-close-1000/ub/rss",
		"connect-close-1000/ub":     "connect-close-1000/ub/rss",
		"connect-close-1000/ub/rss": "connect-close-1000/ub/rss",
		"connect-close":             "",
		"connect-close-1000/shm/fd": "",
	} {
		var got []string
		for _, c := range selectCases(slices.Clone(cases), only) {
			got = append(got, c.Name)
		}
		if strings.Join(got, " ") != want {
			t.Errorf("-case %s: %v, want %s", only, got, want)
		}
	}
}

func TestBenchBadArgs(t *testing.T) {
	for _, args := range [][]string{{}, {""}, {"nosuch"}, {"shm", "-rounds", "x"}} {
		if err := benchCmd(args, &bytes.Buffer{}); err == nil {
			t.Errorf("bench %q succeeded", args)
		}
	}
}

// TestDemoMQ runs `ubctl demo mq` on the real brokers, briefly: both
// drop-ins' rows with a ratio.
func TestDemoMQ(t *testing.T) {
	demoMQOptions = bench.Options{Rounds: 1, Duration: 200 * time.Millisecond}
	var out bytes.Buffer
	if err := demoCmd([]string{"mq"}, &out); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	for _, want := range []string{"Pulsar " + testenv.PulsarVersion, "ubkit drop-in", "plain client"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo mq output lacks %q:\n%s", want, out.String())
		}
	}
	for _, row := range []string{"pulsar", "rocketmq"} {
		if !regexp.MustCompile(`(?m)^  ` + row + ` +\d+ msg/s +\d+ msg/s +[0-9.]+x$`).MatchString(out.String()) {
			t.Errorf("demo mq output has no %s row with a ratio:\n%s", row, out.String())
		}
	}
}

func TestDemo(t *testing.T) {
	demoOptions = bench.Options{Rounds: 1, Duration: 30 * time.Millisecond}
	demoCalls = 20
	demoWithK8s = false // TestDemoK8s runs it
	demoFSSize, demoFSProcs = 16<<20, 3
	var out bytes.Buffer
	if err := demoCmd(nil, &out); err != nil {
		t.Fatal(err)
	}
	// One copy: about the file's 16 MiB (the pages its holders touched)
	// in all; private copies: three of them and more (race builds' heaps).
	if m := regexp.MustCompile(`fs: 3 processes load the same 16 MiB model file at once:\n.*one shared copy per host\) memory +(\d+) MiB.*\n.*os.ReadFile in each process +memory +(\d+) MiB`).FindStringSubmatch(out.String()); m == nil {
		t.Errorf("demo's fs part is missing:\n%s", out.String())
	} else if shared, _ := strconv.Atoi(m[1]); shared < 8 || shared > 24 {
		t.Errorf("demo: the shared copy costs %d MiB for a 16 MiB file in 3 processes:\n%s", shared, out.String())
	} else if private, _ := strconv.Atoi(m[2]); private < 40 {
		t.Errorf("demo: 3 private copies cost %d MiB of a 16 MiB file:\n%s", private, out.String())
	}
	for _, want := range []string{"ubkit shm", "unix socket", "mq.Log", "records/s", "TCP loopback", "latency p50", "messages/s", "gRPC", "path shm", "link down",
		"ub://n0/health?path=shm", "ub://n0/health?path=ub", "client on n1",
		"hello from n2", "through n0's and n2's proxies"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
