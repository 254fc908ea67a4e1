package ubrocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/ubkit-io/ubkit/mq/offload"
)

// PropertyOffload marks a message whose body is an offload reference
// (value "1"). Push consumers of this package do not see it; plain
// clients do, with the reference as the body.
const PropertyOffload = "ubkit-offload"

// DefaultThreshold is Options.Threshold's default.
const DefaultThreshold = 64 << 10

// Options configure the drop-in. The zero value offloads nothing and
// resolves every reference it receives.
type Options struct {
	// Topics opt in to offload: topic names or path.Match patterns. A
	// message to a matching topic whose body is larger than Threshold is
	// offloaded.
	Topics []string
	// Threshold is the body size above which a body is offloaded
	// (default DefaultThreshold).
	Threshold int
	// Store holds offloaded bodies. Default: OpenStore(StoreName,
	// StoreConfig) when Topics is set, closed at Shutdown.
	Store       *offload.Store
	StoreName   string // default "ubrocketmq"
	StoreConfig offload.StoreConfig
	// Resolver resolves references for push consumers. Default:
	// NewResolver(ResolverConfig), closed at Shutdown.
	Resolver       *offload.Resolver
	ResolverConfig offload.ResolverConfig
	// Logger gets the references that could not be resolved (their
	// batch is retried later). Default: slog.Default().
	Logger *slog.Logger
	// Local configures local topics, served by mq.Log instead of the
	// broker (local.go).
	Local LocalConfig
}

func (o *Options) defaults() error {
	if o.Threshold <= 0 {
		o.Threshold = DefaultThreshold
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, p := range append(o.Topics[:len(o.Topics):len(o.Topics)], o.Local.Topics...) {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("ubrocketmq: topic pattern %q: %w", p, err)
		}
	}
	return nil
}

// NewProducer returns a rocketmq.Producer for opts (rocketmq.NewProducer's)
// that offloads bodies as o says.
func NewProducer(o Options, opts ...producer.Option) (rocketmq.Producer, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	p := &offloadProducer{o: o, local: &localProducer{lt: &localTopics{cfg: o.Local}}}
	if o.Store == nil && len(o.Topics) > 0 {
		name := o.StoreName
		if name == "" {
			name = "ubrocketmq"
		}
		s, err := offload.OpenStore(name, o.StoreConfig)
		if err != nil {
			return nil, fmt.Errorf("ubrocketmq: %w", err)
		}
		p.o.Store, p.ownStore = s, true
	}
	inner, err := rocketmq.NewProducer(opts...)
	if err != nil {
		if p.ownStore {
			p.o.Store.Close()
		}
		return nil, err
	}
	p.Producer = inner
	return p, nil
}

type offloadProducer struct {
	rocketmq.Producer
	o        Options
	ownStore bool
	once     sync.Once
	local    *localProducer
}

func (p *offloadProducer) Shutdown() error {
	err := errors.Join(p.Producer.Shutdown(), p.local.lt.close())
	if p.ownStore {
		p.once.Do(func() { err = errors.Join(err, p.o.Store.Close()) })
	}
	return err
}

func (p *offloadProducer) offloads(topic string) bool {
	if p.o.Store == nil {
		return false
	}
	for _, pat := range p.o.Topics {
		if ok, _ := path.Match(pat, topic); ok {
			return true
		}
	}
	return false
}

// offload returns the messages to send for msgs: each itself, or a copy
// whose body is a reference to its body in the store.
func (p *offloadProducer) offload(ctx context.Context, msgs []*primitive.Message) ([]*primitive.Message, error) {
	out := msgs
	for i, m := range msgs {
		if m == nil || len(m.Body) <= p.o.Threshold || !p.offloads(m.Topic) {
			continue
		}
		ref, err := p.o.Store.Put(ctx, m.Body)
		if err != nil {
			return nil, fmt.Errorf("ubrocketmq: offload a %d-byte body: %w", len(m.Body), err)
		}
		b, err := ref.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("ubrocketmq: %w", err)
		}
		c := primitive.NewMessage(m.Topic, b)
		c.Flag, c.TransactionId, c.Batch, c.Queue = m.Flag, m.TransactionId, m.Batch, m.Queue
		props := m.GetProperties()
		props[PropertyOffload] = "1"
		c.WithProperties(props)
		if &out[0] == &msgs[0] {
			out = append([]*primitive.Message(nil), msgs...)
		}
		out[i] = c
	}
	return out, nil
}

func (p *offloadProducer) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	if local, err := p.local.split(msgs); local || err != nil {
		if err != nil {
			return nil, err
		}
		return p.local.send(ctx, msgs)
	}
	out, err := p.offload(ctx, msgs)
	if err != nil {
		return nil, err
	}
	return p.Producer.SendSync(ctx, out...)
}

// SendAsync of local topics sends synchronously (an append to shared
// memory) and calls f before it returns.
func (p *offloadProducer) SendAsync(ctx context.Context, f func(context.Context, *primitive.SendResult, error), msgs ...*primitive.Message) error {
	if local, err := p.local.split(msgs); local || err != nil {
		if err != nil {
			return err
		}
		r, err := p.local.send(ctx, msgs)
		if f != nil {
			f(ctx, r, err)
		}
		return nil
	}
	out, err := p.offload(ctx, msgs)
	if err != nil {
		return err
	}
	return p.Producer.SendAsync(ctx, f, out...)
}

func (p *offloadProducer) SendOneWay(ctx context.Context, msgs ...*primitive.Message) error {
	if local, err := p.local.split(msgs); local || err != nil {
		if err != nil {
			return err
		}
		_, err := p.local.send(ctx, msgs)
		return err
	}
	out, err := p.offload(ctx, msgs)
	if err != nil {
		return err
	}
	return p.Producer.SendOneWay(ctx, out...)
}

func (p *offloadProducer) Request(ctx context.Context, ttl time.Duration, msg *primitive.Message) (*primitive.Message, error) {
	if msg != nil && p.local.lt.local(msg.Topic) {
		return nil, fmt.Errorf("ubrocketmq: request-reply: %w", ErrLocalUnsupported)
	}
	out, err := p.offload(ctx, []*primitive.Message{msg})
	if err != nil {
		return nil, err
	}
	return p.Producer.Request(ctx, ttl, out[0])
}

// NewPushConsumer returns a rocketmq.PushConsumer for opts
// (rocketmq.NewPushConsumer's) whose subscriptions' callbacks get
// offloaded bodies resolved.
func NewPushConsumer(o Options, opts ...consumer.Option) (rocketmq.PushConsumer, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	c := &pushConsumer{o: o, local: &localConsumer{lt: &localTopics{cfg: o.Local}, paused: closedChan(), logger: o.Logger}}
	if o.Resolver == nil {
		r, err := offload.NewResolver(o.ResolverConfig)
		if err != nil {
			return nil, fmt.Errorf("ubrocketmq: %w", err)
		}
		c.o.Resolver, c.ownResolver = r, true
	}
	inner, err := rocketmq.NewPushConsumer(opts...)
	if err != nil {
		if c.ownResolver {
			c.o.Resolver.Close()
		}
		return nil, err
	}
	c.PushConsumer = inner
	return c, nil
}

type pushConsumer struct {
	rocketmq.PushConsumer
	o           Options
	ownResolver bool
	once        sync.Once
	local       *localConsumer

	mu                     sync.Mutex
	started, brokerStarted bool
	brokerSubs             int
}

// Start starts the local subscriptions, and the upstream consumer if it
// has broker subscriptions.
func (c *pushConsumer) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = true
	if err := c.local.start(); err != nil {
		return err
	}
	if c.brokerSubs > 0 && !c.brokerStarted {
		c.brokerStarted = true
		return c.PushConsumer.Start()
	}
	return nil
}

func (c *pushConsumer) Suspend() {
	c.local.suspend()
	c.PushConsumer.Suspend()
}

func (c *pushConsumer) Resume() {
	c.local.resume()
	c.PushConsumer.Resume()
}

func (c *pushConsumer) Unsubscribe(topic string) error {
	if c.local.lt.local(topic) {
		return c.local.unsubscribe(topic)
	}
	return c.PushConsumer.Unsubscribe(topic)
}

func (c *pushConsumer) Shutdown() error {
	c.mu.Lock()
	var err error
	if c.brokerStarted || !c.started {
		err = c.PushConsumer.Shutdown()
	}
	c.mu.Unlock()
	err = errors.Join(err, c.local.shutdown())
	if c.ownResolver {
		c.once.Do(func() { err = errors.Join(err, c.o.Resolver.Close()) })
	}
	return err
}

// Subscribe subscribes f to topic with references resolved: f gets each
// offloaded message with its original body and without PropertyOffload.
// A batch with a reference that cannot be resolved is not given to f:
// it is logged and returned as ConsumeRetryLater, so the broker
// redelivers it (through the group's retry topic and, after its
// retries, to its DLQ topic), or, for an orderly consumer, as
// SuspendCurrentQueueAMoment (retried in place).
//
// A local topic's subscription delivers one message per callback, from
// one goroutine per topic, in queue order (docs/mq.md, "Local topics").
func (c *pushConsumer) Subscribe(topic string, selector consumer.MessageSelector, f func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)) (err error) {
	if c.local.lt.local(topic) {
		return c.local.subscribe(topic, selector, f)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.brokerSubs++
	if c.started && !c.brokerStarted {
		// The first broker subscription after Start starts the upstream
		// consumer.
		defer func() {
			if err == nil {
				c.brokerStarted = true
				err = c.PushConsumer.Start()
			}
		}()
	}
	return c.PushConsumer.Subscribe(topic, selector, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			if m.GetProperty(PropertyOffload) == "" {
				continue
			}
			if err := c.resolve(ctx, m); err != nil {
				c.o.Logger.Error("ubrocketmq: an offloaded body could not be resolved; batch to be consumed later",
					"topic", m.Topic, "msgId", m.MsgId, "reconsumeTimes", m.ReconsumeTimes, "err", err)
				if _, orderly := primitive.GetOrderlyCtx(ctx); orderly {
					// An orderly consumer retries the queue in place.
					return consumer.SuspendCurrentQueueAMoment, nil
				}
				return consumer.ConsumeRetryLater, nil
			}
		}
		return f(ctx, msgs...)
	})
}

func (c *pushConsumer) resolve(ctx context.Context, m *primitive.MessageExt) error {
	ref, err := offload.ParseRef(m.Body)
	if err != nil {
		return err
	}
	b, err := c.o.Resolver.Get(ctx, ref)
	if err != nil {
		return err
	}
	m.Body = b
	m.RemoveProperty(PropertyOffload)
	return nil
}

var (
	_ rocketmq.Producer     = (*offloadProducer)(nil)
	_ rocketmq.PushConsumer = (*pushConsumer)(nil)
)
