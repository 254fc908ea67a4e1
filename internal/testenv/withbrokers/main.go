// Command withbrokers runs a command with real message brokers: it starts
// the brokers its flags name (from the jars make prereqs resolved),
// passes their addresses in the environment (PULSAR_URL, ROCKETMQ_NAMESRV),
// runs the command and stops the brokers. make examples runs the examples
// that need a broker through it; an example names the RocketMQ topics it
// needs made in a line "// withbrokers: -rocketmq-topics=a,b".
//
//	go run ./internal/testenv/withbrokers -pulsar -rocketmq -- go run ./examples/pulsar-offload
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/ubkit-io/ubkit/internal/bench/mqsuite"
)

func main() {
	pulsar := flag.Bool("pulsar", false, "start a Pulsar standalone (PULSAR_URL)")
	rocketmq := flag.Bool("rocketmq", false, "start a RocketMQ name server and broker (ROCKETMQ_NAMESRV)")
	topics := flag.String("rocketmq-topics", "", "comma-separated RocketMQ topics to create (with one queue each) before the command runs")
	flag.Parse()
	rlog.SetLogLevel("error") // the admin client logs each topic at info
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "withbrokers: no command")
		os.Exit(2)
	}
	var ts []string
	if *topics != "" {
		ts = strings.Split(*topics, ",")
	}
	code, err := run(*pulsar, *rocketmq || len(ts) > 0, ts, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "withbrokers:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(pulsar, rocketmq bool, topics, args []string) (int, error) {
	b := mqsuite.NewBrokers()
	defer b.Close()
	env := os.Environ()
	if pulsar {
		fmt.Fprintln(os.Stderr, "withbrokers: starting Pulsar standalone")
		p, err := b.Pulsar()
		if err != nil {
			return 1, fmt.Errorf("pulsar: %w", err)
		}
		env = append(env, "PULSAR_URL="+p.ServiceURL)
	}
	if rocketmq {
		fmt.Fprintln(os.Stderr, "withbrokers: starting a RocketMQ name server and broker")
		r, err := b.RocketMQ()
		if err != nil {
			return 1, fmt.Errorf("rocketmq: %w", err)
		}
		env = append(env, "ROCKETMQ_NAMESRV="+r.NamesrvAddr)
		for _, t := range topics {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err := r.CreateTopic(ctx, t, 1)
			cancel()
			if err != nil {
				return 1, err
			}
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.ExitCode(), err
	}
	return 0, err
}
