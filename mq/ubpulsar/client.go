package ubpulsar

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/mq/offload"
)

// PropertyOffload marks a message whose payload is an offload reference
// (value "1"). Consumers of this package do not see it; plain clients
// do, with the reference as the payload.
const PropertyOffload = "ubkit-offload"

// DefaultThreshold is Options.Threshold's default.
const DefaultThreshold = 64 << 10

// Options configure the drop-in. The zero value offloads nothing and
// resolves every reference it receives.
type Options struct {
	// Topics opt in to offload: topic names or path.Match patterns
	// ("persistent://public/default/results-*"), short names ("results")
	// meaning persistent://public/default/. A producer's topic that
	// matches offloads payloads larger than Threshold.
	Topics []string
	// Threshold is the payload size above which a payload is offloaded
	// (default DefaultThreshold).
	Threshold int
	// Store holds offloaded payloads. Default: OpenStore(StoreName,
	// StoreConfig) when Topics is set, closed with the client.
	Store       *offload.Store
	StoreName   string // default "ubpulsar"
	StoreConfig offload.StoreConfig
	// Resolver resolves references for consumers. Default:
	// NewResolver(ResolverConfig), closed with the client.
	Resolver       *offload.Resolver
	ResolverConfig offload.ResolverConfig
	// Logger gets the references that could not be resolved (and were
	// nacked). Default: slog.Default().
	Logger *slog.Logger
	// Local configures local topics, served by mq.Log instead of the
	// broker (local.go).
	Local LocalConfig
}

// NewClient returns a pulsar.Client for opts (pulsar.NewClient's) that
// offloads payloads as o says.
func NewClient(opts pulsar.ClientOptions, o Options) (pulsar.Client, error) {
	if o.Threshold <= 0 {
		o.Threshold = DefaultThreshold
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, p := range append(o.Topics[:len(o.Topics):len(o.Topics)], o.Local.Topics...) {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("ubpulsar: topic pattern %q: %w", p, err)
		}
	}
	c := &client{o: o}
	if o.Store == nil && len(o.Topics) > 0 {
		name := o.StoreName
		if name == "" {
			name = "ubpulsar"
		}
		s, err := offload.OpenStore(name, o.StoreConfig)
		if err != nil {
			return nil, fmt.Errorf("ubpulsar: %w", err)
		}
		c.o.Store, c.ownStore = s, true
	}
	if o.Resolver == nil {
		r, err := offload.NewResolver(o.ResolverConfig)
		if err != nil {
			c.closeOwn()
			return nil, fmt.Errorf("ubpulsar: %w", err)
		}
		c.o.Resolver, c.ownResolver = r, true
	}
	inner, err := pulsar.NewClient(opts)
	if err != nil {
		c.closeOwn()
		return nil, err
	}
	c.Client = inner
	return c, nil
}

type client struct {
	pulsar.Client
	o                     Options
	ownStore, ownResolver bool
	closeOnce             sync.Once

	logsMu     sync.Mutex
	logs       map[string]*mq.Log // local topics' logs, by name
	consumers  map[*localConsumer]struct{}
	readers    map[*localReader]struct{}
	logsClosed bool
	producers  atomic.Int64
}

func (c *client) closeOwn() error {
	var errs []error
	if c.ownStore {
		errs = append(errs, c.o.Store.Close())
	}
	if c.ownResolver {
		errs = append(errs, c.o.Resolver.Close())
	}
	return errors.Join(errs...)
}

func (c *client) Close() {
	c.closeOnce.Do(func() {
		c.Client.Close()
		c.closeOwn()
		c.closeLocal()
	})
}

// fullTopic is a topic's full name, as the broker normalises it.
func fullTopic(t string) string {
	if strings.Contains(t, "://") {
		return t
	}
	if strings.Count(t, "/") == 2 { // tenant/namespace/topic
		return "persistent://" + t
	}
	return "persistent://public/default/" + t
}

// offloads reports whether topic opted in.
func (c *client) offloads(topic string) bool {
	if c.o.Store == nil {
		return false
	}
	t := fullTopic(topic)
	for _, p := range c.o.Topics {
		if ok, _ := path.Match(fullTopic(p), t); ok {
			return true
		}
	}
	return false
}

func (c *client) CreateProducer(opts pulsar.ProducerOptions) (pulsar.Producer, error) {
	if c.local(opts.Topic) {
		return c.createLocalProducer(opts)
	}
	p, err := c.Client.CreateProducer(opts)
	if err != nil || !c.offloads(opts.Topic) {
		return p, err
	}
	return &producer{Producer: p, c: c}, nil
}

func (c *client) Subscribe(opts pulsar.ConsumerOptions) (pulsar.Consumer, error) {
	if c.local(opts.Topic) || slices.ContainsFunc(opts.Topics, c.local) {
		return c.subscribeLocal(opts)
	}
	w := &consumer{c: c, done: make(chan struct{})}
	user := opts.MessageChannel
	if user != nil {
		// The upstream consumer delivers into a channel of ours; a
		// goroutine resolves and forwards into the user's.
		opts.MessageChannel = make(chan pulsar.ConsumerMessage, max(cap(user), 1))
	}
	inner, err := c.Client.Subscribe(opts)
	if err != nil {
		return nil, err
	}
	w.Consumer = inner
	if user != nil {
		w.ch = user
		w.startForward(opts.MessageChannel, user)
	}
	return w, nil
}

func (c *client) CreateReader(opts pulsar.ReaderOptions) (pulsar.Reader, error) {
	if c.local(opts.Topic) {
		return c.createLocalReader(opts)
	}
	r, err := c.Client.CreateReader(opts)
	if err != nil {
		return nil, err
	}
	return &reader{Reader: r, c: c}, nil
}

func (c *client) TopicPartitions(topic string) ([]string, error) {
	if c.local(topic) {
		return c.localPartitions(topic)
	}
	return c.Client.TopicPartitions(topic)
}

var (
	_ pulsar.Client   = (*client)(nil)
	_ pulsar.Producer = (*producer)(nil)
	_ pulsar.Consumer = (*consumer)(nil)
	_ pulsar.Reader   = (*reader)(nil)
	_ pulsar.Message  = (*message)(nil)
)
