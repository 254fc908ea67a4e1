package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

func init() { rlog.SetLogLevel("error") }

func check(errs ...error) {
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "rocketmq-offload:", err)
		os.Exit(1)
	}
}

// waitFor returns the next line the consumer sent, failing after a
// minute or on a checksum that did not match.
func waitFor(got <-chan string) string {
	select {
	case s := <-got:
		if !strings.HasSuffix(s, "checksum ok true") {
			check(fmt.Errorf("%s: the body is not the one sent", s))
		}
		return strings.TrimSuffix(s, " true")
	case <-time.After(time.Minute):
		check(errors.New("no result within a minute"))
		return ""
	}
}

// tensor is a stand-in for an inference result: 1 MiB of random bytes.
func tensor() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// brokerAddr is the broker's address from the environment variable env;
// without it the program cannot run, and says so.
func brokerAddr(env string) string {
	a := os.Getenv(env)
	if a == "" {
		fmt.Fprintln(os.Stderr, "rocketmq-offload: needs a broker: set ROCKETMQ_NAMESRV=host:port (make examples starts one for it)")
		os.Exit(2)
	}
	return a
}
