package main

import (
	"fmt"
	"math/rand/v2"
	"os"

	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "pulsar-offload:", err)
		os.Exit(1)
	}
}

// quiet is pulsar-client-go's logger at warning level (it logs every
// connection at info).
func quiet() plog.Logger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return plog.NewLoggerWithLogrus(l)
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
		fmt.Fprintln(os.Stderr, "pulsar-offload: needs a broker: set PULSAR_URL=pulsar://host:port (make examples starts one for it)")
		os.Exit(2)
	}
	return a
}
