package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/cachesuite"
	"github.com/ubkit-io/ubkit/internal/bench/fssuite"
	"github.com/ubkit-io/ubkit/internal/bench/k8ssuite"
	"github.com/ubkit-io/ubkit/internal/bench/meshsuite"
	"github.com/ubkit-io/ubkit/internal/bench/mqsuite"
	"github.com/ubkit-io/ubkit/internal/bench/shmsuite"
	"github.com/ubkit-io/ubkit/internal/bench/transportsuite"
	"github.com/ubkit-io/ubkit/internal/bench/ubsuite"
	"github.com/ubkit-io/ubkit/internal/osproc"
)

var suites = map[string]func(o *benchOpts) ([]bench.Case, error){
	"ub":        func(o *benchOpts) ([]bench.Case, error) { return ubsuite.Cases(), nil },
	"transport": func(o *benchOpts) ([]bench.Case, error) { return transportsuite.Cases(), nil },
	"mesh":      func(o *benchOpts) ([]bench.Case, error) { return meshsuite.Cases(), nil },
	"fs": func(o *benchOpts) ([]bench.Case, error) {
		// Its files (2 GiB and 1 GiB, a quarter with -quick) are made
		// once in the cache directory; Python's safetensors comes from
		// make prereqs.
		e := fssuite.NewEnv(cacheDir(), o.quick)
		o.addCleanup(e.Close)
		return e.Cases(), nil
	},
	"mq": func(o *benchOpts) ([]bench.Case, error) {
		// The offload cases start Pulsar and RocketMQ once, on first use.
		b := mqsuite.NewBrokers()
		o.addCleanup(b.Close)
		return append(append(mqsuite.Cases(), mqsuite.OffloadCases(b)...), mqsuite.LocalCases(b)...), nil
	},
	"cache": func(o *benchOpts) ([]bench.Case, error) {
		// Real redis-server and memcached, started as the cases need them.
		e := cachesuite.NewEnv()
		o.addCleanup(e.Close)
		return e.Cases(), nil
	},
	"k8s": func(o *benchOpts) ([]bench.Case, error) {
		// A real control plane (k8stest's binaries) and kwok, started per
		// scale; the controller in a process of its own.
		dir, missing, err := k8sBinaries()
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			return nil, errK8sNotCached(dir, missing)
		}
		e := &k8ssuite.Env{}
		o.addCleanup(e.Close)
		return e.Cases(), nil
	},
	"shm": func(o *benchOpts) ([]bench.Case, error) {
		bin := ""
		if !o.noShmipc {
			b, err := shmsuite.BuildShmipc(cacheDir())
			if err != nil {
				fmt.Fprintf(os.Stderr, "warning: shmipc-go baseline unavailable: %v\n", err)
			}
			bin = b
		}
		return shmsuite.Cases(bin), nil
	},
}

type benchOpts struct {
	quick, json, noShmipc, verbose bool
	rounds                         int
	duration                       time.Duration
	only, profile                  string
	mu                             sync.Mutex
	cleanups                       []func() // run when benchCmd returns, or on an interrupt
	cleaned                        sync.Once
}

func (o *benchOpts) addCleanup(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cleanups = append(o.cleanups, f)
}

// cleanup stops what the suites started (real servers), once.
func (o *benchOpts) cleanup() {
	o.cleaned.Do(func() {
		o.mu.Lock()
		fs := o.cleanups
		o.mu.Unlock()
		for _, f := range fs {
			f()
		}
	})
}

func benchCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o benchOpts
	defer o.cleanup()
	// Ctrl-C must not leave the servers a suite started running.
	sig := make(chan os.Signal, 1)
	osproc.NotifyStop(sig)
	defer func() {
		signal.Stop(sig)
		close(sig)
	}()
	go func() {
		if _, ok := <-sig; ok {
			o.cleanup()
			os.Exit(130)
		}
	}()
	fs.BoolVar(&o.quick, "quick", false, "short runs (under 30 seconds per suite)")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	fs.BoolVar(&o.noShmipc, "no-shmipc", false, "leave out the shmipc-go baseline")
	fs.BoolVar(&o.verbose, "v", false, "print each round")
	fs.IntVar(&o.rounds, "rounds", 0, "measured rounds per contender (default 5, 3 with -quick)")
	fs.DurationVar(&o.duration, "duration", 0, "length of each run (default 1s, 200ms with -quick)")
	fs.StringVar(&o.only, "case", "", "run only this case, or the cases under it (connect-close-1000 runs connect-close-1000/shm/fds, ...)")
	fs.StringVar(&o.profile, "cpuprofile", "", "write CPU profiles of this process and of every peer (their first 3s) into this directory")
	suite := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		suite, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if suite == "" && fs.NArg() > 0 {
		suite = fs.Arg(0)
	}
	names := []string{suite}
	if suite == "all" {
		names = names[:0]
		for n := range suites {
			names = append(names, n)
		}
		slices.Sort(names)
	} else if _, ok := suites[suite]; !ok || suite == "" {
		return fmt.Errorf("unknown suite %q (have: cache, fs, k8s, mesh, mq, shm, ub, transport, all)", suite)
	}
	opts := bench.Options{Rounds: 5, Duration: time.Second, Warmup: 200 * time.Millisecond}
	if o.quick {
		opts = bench.Options{Rounds: 3, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond}
	}
	if o.rounds > 0 {
		opts.Rounds = o.rounds
	}
	if o.duration > 0 {
		opts.Duration = o.duration
	}
	if o.verbose {
		opts.Progress = os.Stderr
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return err
		}
		os.Setenv(bench.EnvProfileDir, o.profile)
		f, err := os.Create(filepath.Join(o.profile, "ubctl.prof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, n := range names {
		cases, err := suites[n](&o)
		if suite == "all" && errors.Is(err, errK8sBinaries) {
			fmt.Fprintf(os.Stderr, "warning: suite %s skipped: %v\n", n, err)
			continue
		}
		if err != nil {
			return err
		}
		if o.only != "" {
			cases = selectCases(cases, o.only)
		}
		rep, err := bench.Run(n, cases, opts)
		if err != nil {
			return err
		}
		w := out
		if o.json {
			err = rep.WriteJSON(w)
		} else {
			err = rep.WriteTable(w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// selectCases keeps the case called only and the cases under it
// ("connect-close-1000" keeps "connect-close-1000/shm/fds").
func selectCases(cases []bench.Case, only string) []bench.Case {
	return slices.DeleteFunc(cases, func(c bench.Case) bool {
		return c.Name != only && !strings.HasPrefix(c.Name, only+"/")
	})
}
