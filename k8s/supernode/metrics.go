package supernode

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// The controller's metrics, on controller-runtime's registry (served by
// the manager's metrics endpoint beside controller-runtime's own
// controller_runtime_reconcile_* series).
var (
	reconcilesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ubkit_supernode_reconciles_total",
		Help: "SuperNode reconciles, by result (success; requeue: the SuperNode is not in the cache yet, so again shortly; error).",
	}, []string{"result"})
	reconcileSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ubkit_supernode_reconcile_duration_seconds",
		Help:    "How long one SuperNode reconcile took.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	ignoredNodeEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ubkit_supernode_ignored_node_events_total",
		Help: "Node events (an update once, for its old and new Node) carrying a supernode.ubkit.io/id that cannot name a SuperNode (not a DNS-1123 subdomain of at most 63 characters), which is ignored.",
	})
	membersByHealth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ubkit_supernode_members",
		Help: "Members of each SuperNode, by health (Ready, NotReady, Unknown, Missing); a SuperNode's series go when it is deleted.",
	}, []string{"supernode", "health"})
)

func init() {
	metrics.Registry.MustRegister(reconcilesTotal, reconcileSeconds, ignoredNodeEvents, membersByHealth)
}

func setMemberGauge(sn string, st *v1alpha1.SuperNodeStatus) {
	counts := map[v1alpha1.MemberHealth]int{}
	for _, m := range st.Members {
		counts[m.Health]++
	}
	for _, h := range []v1alpha1.MemberHealth{v1alpha1.MemberReady, v1alpha1.MemberNotReady, v1alpha1.MemberUnknown, v1alpha1.MemberMissing} {
		membersByHealth.WithLabelValues(sn, string(h)).Set(float64(counts[h]))
	}
}

func pingCheck(*http.Request) error { return nil }
