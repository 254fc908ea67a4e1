package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestResolveBrokerJars resolves the broker jars into an empty cache, as
// ubctl demo mq does on a fresh machine (from the user's Maven repository
// that make prereqs filled, so in seconds), and finds nothing missing
// after.
func TestResolveBrokerJars(t *testing.T) {
	t.Setenv("UBKIT_CACHE", t.TempDir())
	missing, err := BrokerJarsMissing()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pulsar-" + PulsarVersion, "rocketmq-" + RocketMQVersion}; !slices.Equal(missing, want) {
		t.Fatalf("an empty cache misses %v, want %v", missing, want)
	}
	var out bytes.Buffer
	if err := ResolveBrokerJars(&out); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if missing, err := BrokerJarsMissing(); err != nil || len(missing) > 0 {
		t.Fatalf("after resolving: missing %v, %v\n%s", missing, err, out.String())
	}
	cache := os.Getenv("UBKIT_CACHE")
	if _, err := os.Stat(filepath.Join(cache, "pulsar-"+PulsarVersion, "lib", "pulsar-broker-"+PulsarVersion+".jar")); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out.Bytes(), []byte("resolving pulsar "+PulsarVersion)) {
		t.Errorf("no progress line for pulsar:\n%s", out.String())
	}
}
