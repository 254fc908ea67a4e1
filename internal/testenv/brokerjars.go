package testenv

import (
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// The broker part of prereqs.sh, and the need function it uses: what
// ResolveBrokerJars runs.
var (
	//go:embed need.sh
	needScript string
	//go:embed brokerjars.sh
	brokerJarsScript string
)

// brokerMarkers are the jars whose presence says a broker's lib directory
// is complete (brokerjars.sh renames it into place whole).
var brokerMarkers = map[string]string{
	"pulsar-" + PulsarVersion:     "pulsar-broker-" + PulsarVersion + ".jar",
	"rocketmq-" + RocketMQVersion: "rocketmq-broker-" + RocketMQVersion + ".jar",
}

// BrokerJarsMissing returns the brokers (name-version) whose jars are not
// in the project cache.
func BrokerJarsMissing() ([]string, error) {
	cache, err := cacheDir()
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, b := range []string{"pulsar-" + PulsarVersion, "rocketmq-" + RocketMQVersion} {
		if _, err := os.Stat(filepath.Join(cache, b, "lib", brokerMarkers[b])); err != nil {
			missing = append(missing, b)
		}
	}
	return missing, nil
}

// ResolveBrokerJars resolves the brokers' jars that are missing from
// Maven Central into the project cache, as make prereqs does (Java 17 and
// Maven installed first when this runs as root on Debian), writing what
// it does to w.
func ResolveBrokerJars(w io.Writer) error {
	cache, err := cacheDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	cmd := exec.Command("bash", "-c", "set -euo pipefail\n"+needScript+"\n"+brokerJarsScript)
	cmd.Env = append(os.Environ(), "cache="+cache)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testenv: resolving the broker jars into %s: %w", cache, err)
	}
	return nil
}
