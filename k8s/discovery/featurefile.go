package discovery

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultFeatureDir is where NFD's worker reads local feature files.
const DefaultFeatureDir = "/etc/kubernetes/node-feature-discovery/features.d"

// DefaultFeatureFile is the name of discovery's file in that directory.
const DefaultFeatureFile = "ubkit"

// FeatureFile returns the content of an NFD local feature file
// (features.d) for labels: a comment, then one "key=value" line per
// label, sorted. nfd-worker turns each line into a label of its Node
// (the namespace supernode.ubkit.io must be in nfd-master's
// -extra-label-ns) and into an element of the local.label feature, for
// NodeFeatureRules.
func FeatureFile(labels map[string]string) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by ubkit-discovery; rewritten on every change. Do not edit.\n")
	for _, k := range sortedKeys(labels) {
		fmt.Fprintf(&b, "%s=%s\n", k, labels[k])
	}
	return b.Bytes()
}

// WriteFeatureFile writes FeatureFile(labels) to dir/name atomically: a
// temporary file in dir, synced and renamed over the old one, so that
// nfd-worker never reads half a file. It creates dir if needed.
func WriteFeatureFile(dir, name string, labels map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(FeatureFile(labels)); err != nil {
		tmp.Close()
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("discovery: feature file: %w", err)
	}
	return nil
}
