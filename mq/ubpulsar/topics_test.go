package ubpulsar

import (
	"testing"

	"github.com/ubkit-io/ubkit/mq/offload"
)

// TestOffloads: which producer topics opt in, by name or pattern, short
// or full.
func TestOffloads(t *testing.T) {
	c := &client{o: Options{Store: &offload.Store{}, Topics: []string{"results-*", "persistent://tenant/ns/exact", "other/ns/t"}}}
	for topic, want := range map[string]bool{
		"results-1": true, "persistent://public/default/results-x": true, "results": false,
		"persistent://tenant/ns/exact": true, "tenant/ns/exact": true, "other/ns/t": true, "persistent://other/ns/t": true,
		"non-persistent://public/default/results-1": false, "logs": false,
	} {
		if got := c.offloads(topic); got != want {
			t.Errorf("%s: offloads %v, want %v", topic, got, want)
		}
	}
	if (&client{o: Options{Topics: []string{"*"}}}).offloads("x") {
		t.Error("a client without a store offloads")
	}
	if _, err := NewClient(clientOptions("pulsar://127.0.0.1:1"), Options{Topics: []string{"[bad"}}); err == nil {
		t.Error("a bad pattern accepted")
	}
}
