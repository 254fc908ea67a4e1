package ubrocketmq

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/ubkit-io/ubkit/mq"
)

// LocalConfig configures local topics: topics served entirely by an
// mq.Log in shared memory, for producers and consumers that all live in
// the super node. docs/mq.md, "Local topics", lists how they differ from
// the broker's.
type LocalConfig struct {
	// Topics are the local topics: names or path.Match patterns.
	Topics []string
	// Queues is each local topic's queue count (default 4, RocketMQ's
	// default) when this process creates its log; a log that exists
	// keeps its own.
	Queues int
	// Log is the shape of a log this process creates (its Partitions is
	// Queues above). A dead-letter topic's log gets segments 4 KiB
	// larger, so that a dead letter of any record fits.
	Log mq.Config
	// Group is the push consumer's consumer group on local topics (the
	// upstream options are opaque): required to subscribe to one.
	Group string
	// MaxReconsumeTimes, if positive, is how often a message is
	// reconsumed after ConsumeRetryLater before it goes to the local
	// dead-letter topic "%DLQ%"+Group (which must be local too). Zero
	// retries forever.
	MaxReconsumeTimes int
	// RetryDelay is how long a message given back with
	// ConsumeRetryLater waits before its redelivery (default 1 s; the
	// broker's delay levels start at 10 s).
	RetryDelay time.Duration
}

// ErrLocalUnsupported is the error of a method or option that local
// topics do not implement (docs/mq.md, "Local topics").
var ErrLocalUnsupported = errors.New("ubrocketmq: not supported on a local topic")

// LocalLogName is the mq.Log that serves local topic topic; remove it
// (mq.Remove) to delete the topic and its messages.
func LocalLogName(topic string) string { return "ubr-" + safeName(topic) }

func localGroupName(group string) string { return safeName(group) }

// safeName maps s to a segment name: its allowed characters kept, the
// rest '_', and a hash of s so that names that map alike differ.
func safeName(s string) string {
	h := fnv.New32a()
	h.Write([]byte(s))
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			b[i] = '_'
		}
	}
	// Short enough that a group's segment (mq-<log>-g-<group>, with
	// shm's user prefix) stays within shm's 200 characters.
	if len(b) > 64 {
		b = b[len(b)-64:]
	}
	return string(b) + "-" + strconv.FormatUint(uint64(h.Sum32()), 36)
}

// localTopics is the local-topic state a producer or push consumer
// shares: the config and the logs it opened.
type localTopics struct {
	cfg    LocalConfig
	mu     sync.Mutex
	logs   map[string]*mq.Log
	closed bool
}

func (lt *localTopics) local(topic string) bool {
	for _, p := range lt.cfg.Topics {
		if ok, _ := path.Match(p, topic); ok {
			return true
		}
	}
	return false
}

func (lt *localTopics) log(topic string, dlq bool) (*mq.Log, error) {
	name := LocalLogName(topic)
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.closed {
		return nil, fmt.Errorf("ubrocketmq: shut down: %w", mq.ErrClosed)
	}
	if l := lt.logs[name]; l != nil {
		return l, nil
	}
	cfg := lt.cfg.Log
	cfg.Partitions = lt.cfg.Queues
	if cfg.Partitions <= 0 {
		cfg.Partitions = 4
	}
	if dlq {
		if cfg.SegmentSize == 0 {
			cfg.SegmentSize = 8 << 20
		}
		cfg.SegmentSize += 4096
	}
	var l *mq.Log
	var err error
	for range 3 { // created or removed by another process meanwhile
		if l, err = mq.Open(name); !errors.Is(err, os.ErrNotExist) {
			break
		}
		if l, err = mq.Create(name, cfg); !errors.Is(err, os.ErrExist) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ubrocketmq: local topic %s: %w", topic, err)
	}
	if lt.logs == nil {
		lt.logs = map[string]*mq.Log{}
	}
	lt.logs[name] = l
	return l, nil
}

func (lt *localTopics) close() error {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.closed = true
	var errs []error
	for _, l := range lt.logs {
		errs = append(errs, l.Close())
	}
	lt.logs = nil
	return errors.Join(errs...)
}

// localProducer sends the messages of local topics.
type localProducer struct {
	lt *localTopics
	rr atomic.Uint32 // round-robin queue of messages without a sharding key
}

// split reports whether msgs go to local topics: all of them (to one
// topic), or none; a mix is an error.
func (p *localProducer) split(msgs []*primitive.Message) (bool, error) {
	local := 0
	for _, m := range msgs {
		if m != nil && p.lt.local(m.Topic) {
			local++
		}
	}
	switch {
	case local == 0:
		return false, nil
	case local < len(msgs):
		return true, fmt.Errorf("ubrocketmq: a batch of local and broker topics: %w", ErrLocalUnsupported)
	}
	for _, m := range msgs[1:] {
		if m.Topic != msgs[0].Topic {
			return true, errors.New("ubrocketmq: a batch to several topics")
		}
	}
	return true, nil
}

// send appends msgs to their local topic, all to one queue (as a batch
// goes to one queue): the queue msgs[0].Queue names, else the FNV hash
// of its sharding key (as producer.NewHashQueueSelector), else round
// robin.
func (p *localProducer) send(ctx context.Context, msgs []*primitive.Message) (*primitive.SendResult, error) {
	if len(msgs) == 0 {
		return nil, errors.New("ubrocketmq: no message")
	}
	first := msgs[0]
	l, err := p.lt.log(first.Topic, false)
	if err != nil {
		return nil, err
	}
	n := l.Config().Partitions
	var q int
	switch key := first.GetShardingKey(); {
	case first.Queue != nil:
		q = first.Queue.QueueId
		if q < 0 || q >= n {
			return nil, fmt.Errorf("ubrocketmq: queue %d of local topic %s's %d", q, first.Topic, n)
		}
	case key != "":
		h := fnv.New32a()
		h.Write([]byte(key))
		q = int(h.Sum32()) % n
		if q < 0 {
			q = -q
		}
	default:
		q = int(p.rr.Add(1)-1) % n
	}
	res := &primitive.SendResult{Status: primitive.SendOK, MessageQueue: &primitive.MessageQueue{Topic: first.Topic, BrokerName: localBroker, QueueId: q}}
	var ids []string
	for _, m := range msgs {
		if m.GetProperty(primitive.PropertyDelayTimeLevel) != "" || m.GetProperty(primitive.PropertyTimerDeliverMS) != "" {
			return nil, fmt.Errorf("ubrocketmq: delayed delivery: %w", ErrLocalUnsupported)
		}
		if m.TransactionId != "" {
			return nil, fmt.Errorf("ubrocketmq: transactions: %w", ErrLocalUnsupported)
		}
		r := localRecord{props: m.GetProperties(), born: time.Now().UnixMilli(), flag: m.Flag, body: m.Body}
		if err := r.check(); err != nil {
			return nil, err
		}
		lo, err := l.Loan(ctx, q, r.size())
		if err != nil {
			return nil, fmt.Errorf("ubrocketmq: send to %s: %w", first.Topic, err)
		}
		r.encode(lo.Bytes())
		if err := lo.Commit(); err != nil {
			return nil, fmt.Errorf("ubrocketmq: send to %s: %w", first.Topic, err)
		}
		if len(ids) == 0 {
			res.QueueOffset = int64(lo.Offset())
		}
		ids = append(ids, localMsgID(q, lo.Offset()))
	}
	res.MsgID = strings.Join(ids, ",")
	res.OffsetMsgID = res.MsgID
	return res, nil
}

// localBroker is the broker name of local queues.
const localBroker = "ubkit-local"

func localMsgID(q int, off uint64) string {
	return "local-" + strconv.Itoa(q) + "-" + strconv.FormatUint(off, 10)
}

// localSub is a push consumer's subscription to a local topic.
type localSub struct {
	topic string
	tags  map[string]bool // nil: every tag
	f     func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)
	g     *mq.Consumer
	stop  context.CancelFunc
	done  chan struct{}

	mu     sync.Mutex
	timers map[*time.Timer]struct{} // delayed retries
}

// parseTags is a TAG selector's expression: "", "*" or tags joined by
// "||".
func parseTags(sel consumer.MessageSelector) (map[string]bool, error) {
	if sel.Type != "" && sel.Type != consumer.TAG {
		return nil, fmt.Errorf("ubrocketmq: selector type %s: %w", sel.Type, ErrLocalUnsupported)
	}
	e := strings.TrimSpace(sel.Expression)
	if e == "" || e == "*" {
		return nil, nil
	}
	tags := map[string]bool{}
	for _, t := range strings.Split(e, "||") {
		if t = strings.TrimSpace(t); t != "" {
			tags[t] = true
		}
	}
	return tags, nil
}

// localConsumer holds a push consumer's local subscriptions.
type localConsumer struct {
	lt      *localTopics
	mu      sync.Mutex
	subs    map[string]*localSub
	started bool
	paused  chan struct{} // closed while not suspended
	logger  interface {
		Error(string, ...any)
	}
}

func (c *localConsumer) subscribe(topic string, sel consumer.MessageSelector, f func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)) error {
	if c.lt.cfg.Group == "" {
		return errors.New("ubrocketmq: Options.Local.Group must name the consumer group of local topics")
	}
	if f == nil {
		return errors.New("ubrocketmq: a nil callback")
	}
	tags, err := parseTags(sel)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs[topic] != nil {
		return fmt.Errorf("ubrocketmq: %s subscribed already", topic)
	}
	s := &localSub{topic: topic, tags: tags, f: f, timers: map[*time.Timer]struct{}{}}
	if c.subs == nil {
		c.subs = map[string]*localSub{}
	}
	c.subs[topic] = s
	if c.started {
		return c.startSub(s)
	}
	return nil
}

func (c *localConsumer) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return nil
	}
	c.started = true
	for _, s := range c.subs {
		if err := c.startSub(s); err != nil {
			return err
		}
	}
	return nil
}

func (c *localConsumer) startSub(s *localSub) error {
	// A dead-letter topic's log has room for dead letters whoever makes
	// it; its own messages are not dead-lettered again.
	isDLQ := strings.HasPrefix(s.topic, "%DLQ%")
	l, err := c.lt.log(s.topic, isDLQ)
	if err != nil {
		return err
	}
	gc := mq.GroupConfig{VisibilityTimeout: farFuture}
	if n := c.lt.cfg.MaxReconsumeTimes; n > 0 && !isDLQ {
		dlq := "%DLQ%" + c.lt.cfg.Group
		if !c.lt.local(dlq) {
			return fmt.Errorf("ubrocketmq: dead-letter topic %s of a local topic is not local: %w", dlq, ErrLocalUnsupported)
		}
		dl, err := c.lt.log(dlq, true)
		if err != nil {
			return err
		}
		gc.MaxAttempts, gc.DeadLetter = n+1, dl
	}
	g, err := l.JoinGroup(localGroupName(c.lt.cfg.Group), gc)
	if err != nil {
		return fmt.Errorf("ubrocketmq: subscribe to %s: %w", s.topic, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s.g, s.stop, s.done = g, stop, make(chan struct{})
	go c.run(ctx, s)
	return nil
}

// farFuture stands for "no consume timeout": a message stays with its
// consumer until its callback returns, or the consumer leaves or dies.
const farFuture = 10 * 365 * 24 * time.Hour

// run delivers s's messages to its callback one at a time.
func (c *localConsumer) run(ctx context.Context, s *localSub) {
	defer close(s.done)
	retry := c.lt.cfg.RetryDelay
	if retry <= 0 {
		retry = time.Second
	}
	for {
		c.mu.Lock()
		resumed := c.paused
		c.mu.Unlock()
		select {
		case <-resumed:
		case <-ctx.Done():
			return
		}
		m, err := s.g.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.logger.Error("ubrocketmq: local topic receive", "topic", s.topic, "err", err)
			t := time.NewTimer(100 * time.Millisecond) // not a spin on a lasting error
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		b := m.Payload
		if dl, err := mq.ParseDeadLetter(b); err == nil {
			b = dl.Payload
		}
		rec, err := decodeLocal(b)
		if err != nil {
			c.logger.Error("ubrocketmq: a record of a local topic does not decode; acked away", "topic", s.topic,
				"queue", m.Partition, "offset", m.Offset, "err", err)
			s.g.Ack(m)
			continue
		}
		if s.tags != nil && !s.tags[rec.props[primitive.PropertyTags]] {
			s.g.Ack(m) // filtered out, as the broker filters by tag
			continue
		}
		ext := &primitive.MessageExt{Message: primitive.Message{Topic: s.topic, Body: append([]byte(nil), rec.body...), Flag: rec.flag,
			Queue: &primitive.MessageQueue{Topic: s.topic, BrokerName: localBroker, QueueId: m.Partition}},
			MsgId: localMsgID(m.Partition, m.Offset), QueueOffset: int64(m.Offset), BornTimestamp: rec.born,
			ReconsumeTimes: int32(m.Attempt - 1), StoreSize: int32(len(m.Payload))}
		ext.OffsetMsgId = ext.MsgId
		ext.WithProperties(rec.props)
		d := m
		d.Payload = nil
		res, err := s.f(ctx, ext)
		if err == nil && res == consumer.ConsumeSuccess {
			s.g.Ack(d)
			continue
		}
		s.mu.Lock()
		var t *time.Timer
		t = time.AfterFunc(retry, func() {
			s.mu.Lock()
			_, live := s.timers[t]
			delete(s.timers, t)
			s.mu.Unlock()
			if live {
				s.g.Nack(d)
			}
		})
		s.timers[t] = struct{}{}
		s.mu.Unlock()
	}
}

// stopSub ends s: messages it holds go back to the group at once.
func stopSub(s *localSub) error {
	if s.g == nil {
		return nil
	}
	s.stop()
	<-s.done
	s.mu.Lock()
	for t := range s.timers {
		t.Stop()
	}
	s.timers = map[*time.Timer]struct{}{}
	s.mu.Unlock()
	return s.g.Close()
}

func (c *localConsumer) unsubscribe(topic string) error {
	c.mu.Lock()
	s := c.subs[topic]
	delete(c.subs, topic)
	c.mu.Unlock()
	if s == nil {
		return fmt.Errorf("ubrocketmq: %s not subscribed", topic)
	}
	return stopSub(s)
}

func (c *localConsumer) shutdown() error {
	c.mu.Lock()
	subs := c.subs
	c.subs = nil
	c.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, stopSub(s))
	}
	return errors.Join(append(errs, c.lt.close())...)
}

func (c *localConsumer) suspend() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.paused:
		c.paused = make(chan struct{})
	default:
	}
}

func (c *localConsumer) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.paused:
	default:
		close(c.paused)
	}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// RemoveLocal deletes local topic topic: its log and the state of
// consumer groups groups on it. Processes that have them open keep their
// mappings.
func RemoveLocal(topic string, groups ...string) error {
	var errs []error
	for _, g := range groups {
		errs = append(errs, mq.RemoveGroup(LocalLogName(topic), localGroupName(g)))
	}
	return errors.Join(append(errs, mq.Remove(LocalLogName(topic)))...)
}
