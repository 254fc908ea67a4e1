package discovery

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"gopkg.in/yaml.v3"
)

// nodeFeatureRule is the part of NFD's NodeFeatureRule that ubkit's rules
// use.
type nodeFeatureRule struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		Rules []struct {
			Name           string            `yaml:"name"`
			Labels         map[string]string `yaml:"labels"`
			LabelsTemplate string            `yaml:"labelsTemplate"`
			MatchFeatures  []struct {
				Feature   string `yaml:"feature"`
				MatchName *struct {
					Op    string   `yaml:"op"`
					Value []string `yaml:"value"`
				} `yaml:"matchName"`
				MatchExpressions map[string]struct {
					Op    string   `yaml:"op"`
					Value []string `yaml:"value"`
				} `yaml:"matchExpressions"`
			} `yaml:"matchFeatures"`
		} `yaml:"rules"`
	} `yaml:"spec"`
}

// The shipped NodeFeatureRules, evaluated as nfd-master would (the subset
// of its matching they use), on a report's NodeFeature object, give
// exactly the report's labels.
func TestNodeFeatureRules(t *testing.T) {
	data, err := os.ReadFile("../config/nfd/ubkit-supernode.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule nodeFeatureRule
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.APIVersion != "nfd.k8s-sigs.io/v1alpha1" || rule.Kind != "NodeFeatureRule" || len(rule.Spec.Rules) == 0 {
		t.Fatalf("not a NodeFeatureRule: %+v", rule)
	}
	for _, fixtureName := range []string{"ascend-910b-kunpeng", "gpu-a100"} {
		r, err := Scan(ScanOptions{Root: fixture(t, fixtureName), Topology: dev4(t), TopologyNode: "n1",
			Versions: map[DeviceKind]VersionPolicy{GPU: {Minimum: "550"}},
			Firmware: map[DeviceKind]VersionPolicy{GPU: {Minimum: "92"}, NPU: {Exact: "7.5.0.1.129"}},
			Kernel:   VersionPolicy{Minimum: "5.10"}})
		if err != nil {
			t.Fatal(err)
		}
		features := r.Features()
		for _, k := range []string{"kernel.version-match", "firmware-match"} {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(features)), func(f string) bool { return strings.HasSuffix(f, k) }) {
				t.Errorf("%s: no %s feature to test the rules on", fixtureName, k)
			}
		}
		got := map[string]string{}
		for _, ru := range rule.Spec.Rules {
			mf := ru.MatchFeatures[0]
			switch {
			case mf.Feature == "ubkit.discovery" && mf.MatchName != nil:
				if mf.MatchName.Op != "InRegexp" {
					t.Fatalf("rule %q: op %s", ru.Name, mf.MatchName.Op)
				}
				type element struct{ Name, Value string }
				var matched []element
				for _, name := range slices.Sorted(maps.Keys(features)) {
					if slices.ContainsFunc(mf.MatchName.Value, func(re string) bool { return regexp.MustCompile(re).MatchString(name) }) {
						matched = append(matched, element{name, features[name]})
					}
				}
				tmpl, err := template.New(ru.Name).Parse(ru.LabelsTemplate)
				if err != nil {
					t.Fatal(err)
				}
				var out strings.Builder
				if err := tmpl.Execute(&out, map[string]any{"ubkit": map[string]any{"discovery": matched}}); err != nil {
					t.Fatal(err)
				}
				for line := range strings.Lines(out.String()) {
					if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
						got[k] = v
					}
				}
			case mf.Feature == "ubkit.kae":
				for _, e := range r.KAE {
					if slices.Contains(mf.MatchExpressions["class"].Value, e.Class) {
						maps.Copy(got, ru.Labels)
					}
				}
			default:
				t.Fatalf("rule %q matches %s, which the test does not know", ru.Name, mf.Feature)
			}
		}
		if want := r.Labels(); !maps.Equal(got, want) {
			t.Errorf("%s: the rules give\n%v\nwant\n%v", fixtureName, got, want)
		}
	}
}
