package mesh

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// BalancerName is the gRPC load-balancing policy this package registers:
// topology- and load-aware. Select it with a service config:
//
//	{"loadBalancingConfig": [{"ubkit_topology": {"node": "n1", "topology": "dev4"}}]}
//
// and give each address its node with WithNode.
//
// Each call goes to the ready endpoint with the lowest expected cost: the
// topology's path cost from this node to the endpoint's (a round trip of a
// 1 KiB message), plus, per call already outstanding there, the
// endpoint's recent service time. Under light load the cheapest endpoints
// take the calls; as their queues grow, the cost of waiting there passes
// the cost of the trip and calls spill to farther endpoints; endpoints that
// are not ready (failed, draining) take none. Ties are broken at random.
const BalancerName = "ubkit_topology"

type nodeKey struct{}

// WithNode tags a resolver address with the node it runs on.
func WithNode(a resolver.Address, node string) resolver.Address {
	a.Attributes = a.Attributes.WithValue(nodeKey{}, node)
	return a
}

func nodeOf(a resolver.Address) string {
	n, _ := a.Attributes.Value(nodeKey{}).(string)
	return n
}

// balancerConfig is the policy's JSON configuration.
type balancerConfig struct {
	serviceconfig.LoadBalancingConfig `json:"-"`
	Node                              string `json:"node"`
	Topology                          string `json:"topology"`
}

func init() {
	balancer.Register(&builder{Builder: base.NewBalancerBuilder(BalancerName, &pickerBuilder{}, base.Config{HealthCheck: true})})
}

// builder adds config parsing to the base balancer (registered for its
// name), and gives each channel a balancer of its own whose picker builder
// holds the channel's config and endpoint loads.
type builder struct{ balancer.Builder }

func (b *builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var c balancerConfig
	if err := json.Unmarshal(js, &c); err != nil {
		return nil, fmt.Errorf("mesh: %s config: %w", BalancerName, err)
	}
	if c.Node == "" {
		return nil, fmt.Errorf("mesh: %s config needs this process's node", BalancerName)
	}
	if _, err := loadTopology(c.Topology); err != nil {
		return nil, err
	}
	return &c, nil
}

func (b *builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	pb := &pickerBuilder{}
	return &configured{pb: pb, Balancer: base.NewBalancerBuilder(BalancerName, pb, base.Config{HealthCheck: true}).Build(cc, opts)}
}

// configured hands the parsed config to its picker builder.
type configured struct {
	balancer.Balancer
	pb *pickerBuilder
}

func (c *configured) UpdateClientConnState(s balancer.ClientConnState) error {
	if cfg, _ := s.BalancerConfig.(*balancerConfig); cfg != nil {
		c.pb.cfg.Store(cfg)
	}
	return c.Balancer.UpdateClientConnState(s)
}

var topologies sync.Map // source -> *topology.Topology

func loadTopology(src string) (*topology.Topology, error) {
	if t, ok := topologies.Load(src); ok {
		return t.(*topology.Topology), nil
	}
	var t *topology.Topology
	var err error
	if src == "" {
		t, err = topology.FromEnv()
	} else if t, err = topology.Example(src); err != nil {
		t, err = topology.Load(src)
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: %s topology: %w", BalancerName, err)
	}
	topologies.Store(src, t)
	return t, nil
}

// endpointLoad is what the picker knows of one endpoint; it outlives
// pickers so that the counts carry over when the ready set changes.
type endpointLoad struct {
	outstanding atomic.Int64
	serviceNs   atomic.Int64 // exponentially weighted service time
}

type pickerBuilder struct {
	cfg   atomic.Pointer[balancerConfig]
	loads map[balancer.SubConn]*endpointLoad // picker builds are serialized by base
}

type choice struct {
	sc   balancer.SubConn
	cost time.Duration // round trip from this node
	load *endpointLoad
}

func (pb *pickerBuilder) Build(info base.PickerBuildInfo) balancer.Picker {
	if pb.loads == nil {
		pb.loads = map[balancer.SubConn]*endpointLoad{}
	}
	for sc := range pb.loads {
		if _, ok := info.ReadySCs[sc]; !ok {
			delete(pb.loads, sc)
		}
	}
	if len(info.ReadySCs) == 0 {
		return base.NewErrPicker(balancer.ErrNoSubConnAvailable)
	}
	var cs []choice
	for sc, sci := range info.ReadySCs {
		c := choice{sc: sc, cost: time.Duration(1 << 40)}
		if cfg := pb.cfg.Load(); cfg != nil {
			to := nodeOf(sci.Address)
			if to == cfg.Node {
				c.cost = 0
			} else if t, err := loadTopology(cfg.Topology); err == nil {
				if pc, err := t.PathCost(cfg.Node, to, 1024); err == nil {
					c.cost = 2 * pc.Transfer
				}
			}
		}
		if pb.loads[sc] == nil {
			pb.loads[sc] = &endpointLoad{}
		}
		c.load = pb.loads[sc]
		cs = append(cs, c)
	}
	return &picker{choices: cs}
}

type picker struct{ choices []choice }

// defaultService is assumed for an endpoint that has not answered yet.
const defaultService = 100 * time.Microsecond

func (p *picker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	best, bestScore, ties := -1, time.Duration(0), 0
	for i, c := range p.choices {
		svc := time.Duration(c.load.serviceNs.Load())
		if svc == 0 {
			svc = defaultService
		}
		score := c.cost + time.Duration(c.load.outstanding.Load())*svc
		switch {
		case best < 0 || score < bestScore:
			best, bestScore, ties = i, score, 1
		case score == bestScore:
			ties++
			if rand.IntN(ties) == 0 {
				best = i
			}
		}
	}
	c := p.choices[best]
	c.load.outstanding.Add(1)
	start := time.Now()
	return balancer.PickResult{SubConn: c.sc, Done: func(di balancer.DoneInfo) {
		c.load.outstanding.Add(-1)
		if di.Err != nil {
			return // a fast failure must not make an endpoint look cheap
		}
		took := int64(time.Since(start))
		old := c.load.serviceNs.Load()
		if old == 0 {
			c.load.serviceNs.Store(took)
		} else {
			c.load.serviceNs.Store(old + (took-old)/8)
		}
	}}, nil
}
