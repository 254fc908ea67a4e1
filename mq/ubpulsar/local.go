package ubpulsar

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/shm"
)

// LocalConfig configures local topics: topics served entirely by an
// mq.Log in shared memory, for producers and consumers that all live in
// the super node. docs/mq.md, "Local topics", lists how they differ from
// the broker's.
type LocalConfig struct {
	// Topics are the local topics: names or path.Match patterns, short
	// names meaning persistent://public/default/ (as Options.Topics).
	Topics []string
	// Partitions is each local topic's partition count (default 1) when
	// this client creates its log; a log that exists keeps its own.
	Partitions int
	// Log is the shape of a log this client creates (its Partitions is
	// Partitions above). A dead-letter topic's log gets segments 4 KiB
	// larger, so that a dead letter of any record fits.
	Log mq.Config
}

// ErrLocalUnsupported is the error of a method or option that local
// topics do not implement (docs/mq.md, "Local topics").
var ErrLocalUnsupported = errors.New("ubpulsar: not supported on a local topic")

// LocalLogName is the mq.Log that serves local topic topic; remove it
// (mq.Remove) to delete the topic and its messages.
func LocalLogName(topic string) string { return "ubp-" + safeName(fullTopic(topic)) }

// localGroupName is the consumer group of subscription sub.
func localGroupName(sub string) string { return safeName(sub) }

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

// local reports whether topic is a local topic.
func (c *client) local(topic string) bool {
	t := fullTopic(topic)
	for _, p := range c.o.Local.Topics {
		if ok, _ := path.Match(fullTopic(p), t); ok {
			return true
		}
	}
	return false
}

// localLog returns the log of local topic topic, opening (or creating)
// it once per client; the client closes it.
func (c *client) localLog(topic string, dlq bool) (*mq.Log, error) {
	name := LocalLogName(topic)
	c.logsMu.Lock()
	defer c.logsMu.Unlock()
	if c.logsClosed {
		return nil, fmt.Errorf("ubpulsar: client closed: %w", mq.ErrClosed)
	}
	if l := c.logs[name]; l != nil {
		return l, nil
	}
	cfg := c.o.Local.Log
	cfg.Partitions = max(c.o.Local.Partitions, 1)
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
		return nil, fmt.Errorf("ubpulsar: local topic %s: %w", fullTopic(topic), err)
	}
	if c.logs == nil {
		c.logs = map[string]*mq.Log{}
	}
	c.logs[name] = l
	return l, nil
}

// closeLocal closes the local consumers and readers still open (as the
// upstream client closes its consumers), then the logs.
func (c *client) closeLocal() error {
	c.logsMu.Lock()
	c.logsClosed = true
	open := slices.Collect(maps.Keys(c.consumers))
	readers := slices.Collect(maps.Keys(c.readers))
	c.logsMu.Unlock()
	for _, w := range open {
		w.Close()
	}
	for _, r := range readers {
		r.Close()
	}
	c.logsMu.Lock()
	defer c.logsMu.Unlock()
	var errs []error
	for _, l := range c.logs {
		errs = append(errs, l.Close())
	}
	c.logs = nil
	return errors.Join(errs...)
}

// javaStringHash is Pulsar's default key hash (pulsar.JavaStringHash).
func javaStringHash(s string) uint32 {
	var h uint32
	for i := range len(s) {
		h = 31*h + uint32(s[i])
	}
	return h
}

type partitions uint32

func (n partitions) NumPartitions() uint32 { return uint32(n) }

// createLocalProducer is CreateProducer for a local topic.
func (c *client) createLocalProducer(opts pulsar.ProducerOptions) (pulsar.Producer, error) {
	switch {
	case opts.Schema != nil:
		return nil, fmt.Errorf("ubpulsar: a schema: %w", ErrLocalUnsupported)
	case opts.HashingScheme != pulsar.JavaStringHash:
		return nil, fmt.Errorf("ubpulsar: hashing scheme %d (local topics hash keys with JavaStringHash): %w", opts.HashingScheme, ErrLocalUnsupported)
	}
	l, err := c.localLog(opts.Topic, false)
	if err != nil {
		return nil, err
	}
	router := opts.MessageRouter
	if router == nil {
		r := pulsar.NewDefaultRouter(javaStringHash, 0, 0, 0, true)
		router = func(m *pulsar.ProducerMessage, md pulsar.TopicMetadata) int { return r(m, md.NumPartitions()) }
	}
	name := opts.Name
	if name == "" {
		name = fmt.Sprintf("local-%d-%d", os.Getpid(), c.producers.Add(1))
	}
	return &localProducer{l: l, topic: fullTopic(opts.Topic), name: name, router: router}, nil
}

// localProducer is a pulsar.Producer of a local topic: it appends each
// message to the topic's log, encoded in place in the log's memory.
type localProducer struct {
	l      *mq.Log
	topic  string
	name   string
	router func(*pulsar.ProducerMessage, pulsar.TopicMetadata) int
	mu     sync.Mutex // orders sequence ids with appends
	seq    int64
	closed atomic.Bool
}

func (p *localProducer) Topic() string { return p.topic }
func (p *localProducer) Name() string  { return p.name }

// Send appends msg to its partition: the returned id names the record.
// Under a file-backed log's FlushEverySend the record is on disk when
// Send returns.
func (p *localProducer) Send(ctx context.Context, msg *pulsar.ProducerMessage) (pulsar.MessageID, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("ubpulsar: producer closed: %w", mq.ErrClosed)
	}
	switch {
	case msg == nil:
		return nil, errors.New("ubpulsar: a nil message")
	case msg.Value != nil:
		return nil, fmt.Errorf("ubpulsar: a message Value (schema): %w", ErrLocalUnsupported)
	case msg.DeliverAfter != 0 || !msg.DeliverAt.IsZero():
		return nil, fmt.Errorf("ubpulsar: delayed delivery: %w", ErrLocalUnsupported)
	case msg.Transaction != nil:
		return nil, fmt.Errorf("ubpulsar: transactions: %w", ErrLocalUnsupported)
	}
	np := p.l.Config().Partitions
	part := p.router(msg, partitions(np))
	if part < 0 || part >= np {
		return nil, fmt.Errorf("ubpulsar: the router chose partition %d of %d", part, np)
	}
	r := localRecord{key: msg.Key, orderingKey: msg.OrderingKey, producer: p.name, props: msg.Properties,
		publishTime: time.Now().UnixNano(), payload: msg.Payload}
	if !msg.EventTime.IsZero() {
		r.eventTime = msg.EventTime.UnixNano()
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r.seq = p.seq
	if msg.SequenceID != nil {
		r.seq = *msg.SequenceID
	}
	res, err := p.l.Loan(ctx, part, r.size())
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: send to %s: %w", p.topic, err)
	}
	r.encode(res.Bytes())
	if err := res.Commit(); err != nil {
		return nil, fmt.Errorf("ubpulsar: send to %s: %w", p.topic, err)
	}
	p.seq = r.seq + 1
	return &localID{partition: int32(part), offset: res.Offset()}, nil
}

// SendAsync sends synchronously (an append to shared memory) and calls
// callback before it returns.
func (p *localProducer) SendAsync(ctx context.Context, msg *pulsar.ProducerMessage, callback func(pulsar.MessageID, *pulsar.ProducerMessage, error)) {
	id, err := p.Send(ctx, msg)
	if callback != nil {
		callback(id, msg, err)
	}
}

func (p *localProducer) LastSequenceID() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq - 1
}

// Flush has nothing to do: every send is in the log when it returns.
func (p *localProducer) Flush() error                       { return nil }
func (p *localProducer) FlushWithCtx(context.Context) error { return nil }
func (p *localProducer) Close()                             { p.closed.Store(true) }

// localID names a record of a local topic: its partition and offset,
// and, for a received message, the delivery that acks it.
type localID struct {
	partition int32
	offset    uint64
	delivery  *mq.Message
	consumer  *localConsumer
}

// localEntryID is the EntryID of every local topic's message id: no
// broker's (its entries count from 0, and -1 is Earliest's), so an id
// that pulsar.DeserializeMessageID made of a local id's Serialize is
// known for one.
const localEntryID = -2

// Serialize is what upstream's ids serialize to, a MessageIdData in
// protobuf's wire format: ledgerId the offset, entryId localEntryID,
// partition, batch_index -1, batch_size 0. pulsar.DeserializeMessageID
// makes of it an id that CreateReader, Seek and localIDOf take for this
// one.
func (id *localID) Serialize() []byte {
	b := make([]byte, 0, 40)
	field := func(n protowire.Number, v uint64) {
		b = protowire.AppendTag(b, n, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	field(1, id.offset)
	entry, batch := int64(localEntryID), int64(-1)
	field(2, uint64(entry))
	field(3, uint64(int64(id.partition)))
	field(4, uint64(batch))
	field(6, 0)
	return b
}

// localIDOf is id if it is a local id, or the local id a deserialized
// one names (see Serialize).
func localIDOf(id pulsar.MessageID) (*localID, bool) {
	if l, ok := id.(*localID); ok {
		return l, true
	}
	if id.EntryID() == localEntryID && id.LedgerID() >= 0 && id.PartitionIdx() >= 0 {
		return &localID{partition: id.PartitionIdx(), offset: uint64(id.LedgerID())}, true
	}
	return nil, false
}

// LedgerID is the record's offset in its partition's log.
func (id *localID) LedgerID() int64     { return int64(id.offset) }
func (id *localID) EntryID() int64      { return localEntryID }
func (id *localID) BatchIdx() int32     { return -1 }
func (id *localID) PartitionIdx() int32 { return id.partition }
func (id *localID) BatchSize() int32    { return 0 }
func (id *localID) String() string {
	return "local:" + strconv.Itoa(int(id.partition)) + ":" + strconv.FormatUint(id.offset, 10)
}

// localMessage is a message received from a local topic.
type localMessage struct {
	topic   string
	rec     localRecord
	id      *localID
	attempt int
}

func (m *localMessage) Topic() string                 { return m.topic }
func (m *localMessage) ProducerName() string          { return m.rec.producer }
func (m *localMessage) Properties() map[string]string { return m.rec.props }
func (m *localMessage) Payload() []byte               { return m.rec.payload }
func (m *localMessage) ID() pulsar.MessageID          { return m.id }
func (m *localMessage) PublishTime() time.Time        { return time.Unix(0, m.rec.publishTime) }
func (m *localMessage) EventTime() time.Time {
	if m.rec.eventTime == 0 {
		return time.Time{}
	}
	return time.Unix(0, m.rec.eventTime)
}
func (m *localMessage) Key() string                   { return m.rec.key }
func (m *localMessage) OrderingKey() string           { return m.rec.orderingKey }
func (m *localMessage) RedeliveryCount() uint32       { return uint32(m.attempt - 1) }
func (m *localMessage) IsReplicated() bool            { return false }
func (m *localMessage) GetReplicatedFrom() string     { return "" }
func (m *localMessage) SchemaVersion() []byte         { return nil }
func (m *localMessage) Index() *uint64                { return nil }
func (m *localMessage) BrokerPublishTime() *time.Time { return nil }
func (m *localMessage) GetEncryptionContext() *pulsar.EncryptionContext {
	return nil
}
func (m *localMessage) GetSchemaValue(any) error {
	return fmt.Errorf("ubpulsar: schemas: %w", ErrLocalUnsupported)
}

// farFuture stands for "no ack timeout": a message stays with its
// consumer until acked, nacked, or its consumer leaves or dies.
const farFuture = 10 * 365 * 24 * time.Hour

// exclusiveLock takes the lock that makes an Exclusive subscription
// exclusive across processes: a file in a directory of this user's.
func exclusiveLock(logName, group string) (*os.File, error) {
	dir := filepath.Join(os.TempDir(), "ubkit-"+strconv.Itoa(os.Getuid()))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("ubpulsar: %w", err)
	}
	if err := shm.CheckDir(dir); err != nil {
		return nil, fmt.Errorf("ubpulsar: exclusive subscription lock: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, logName+"-"+group+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: %w", err)
	}
	if err := shm.TryLockFile(f); err != nil {
		f.Close()
		if errors.Is(err, shm.ErrLocked) {
			return nil, fmt.Errorf("ubpulsar: exclusive subscription %s has a consumer already: %w", group, err)
		}
		return nil, fmt.Errorf("ubpulsar: %w", err)
	}
	return f, nil
}

// subscribeLocal is Subscribe for a local topic.
func (c *client) subscribeLocal(opts pulsar.ConsumerOptions) (pulsar.Consumer, error) {
	switch {
	case len(opts.Topics) > 0 || opts.TopicsPattern != "":
		return nil, fmt.Errorf("ubpulsar: several topics with a local one: %w", ErrLocalUnsupported)
	case opts.SubscriptionName == "":
		return nil, errors.New("ubpulsar: a subscription needs a name")
	case opts.Schema != nil:
		return nil, fmt.Errorf("ubpulsar: a schema: %w", ErrLocalUnsupported)
	case opts.NackBackoffPolicy != nil || opts.EnableDefaultNackBackoffPolicy:
		return nil, fmt.Errorf("ubpulsar: nack backoff policies: %w", ErrLocalUnsupported)
	case opts.RetryEnable:
		return nil, fmt.Errorf("ubpulsar: retry topics: %w", ErrLocalUnsupported)
	case opts.Type != pulsar.Exclusive && opts.Type != pulsar.Failover && opts.Type != pulsar.Shared && opts.Type != pulsar.KeyShared:
		return nil, fmt.Errorf("ubpulsar: subscription type %d: %w", opts.Type, ErrLocalUnsupported)
	}
	l, err := c.localLog(opts.Topic, false)
	if err != nil {
		return nil, err
	}
	gc := mq.GroupConfig{VisibilityTimeout: farFuture, Logger: c.o.Logger}
	if opts.DLQ != nil {
		if opts.DLQ.MaxDeliveries == 0 {
			return nil, errors.New("ubpulsar: a DLQ policy needs MaxDeliveries")
		}
		topic := opts.DLQ.DeadLetterTopic
		if topic == "" {
			topic = fullTopic(opts.Topic) + "-" + opts.SubscriptionName + "-DLQ"
		}
		if !c.local(topic) {
			return nil, fmt.Errorf("ubpulsar: dead-letter topic %s of a local topic is not local: %w", topic, ErrLocalUnsupported)
		}
		dl, err := c.localLog(topic, true)
		if err != nil {
			return nil, err
		}
		gc.MaxAttempts, gc.DeadLetter = int(opts.DLQ.MaxDeliveries), dl
	}
	group := localGroupName(opts.SubscriptionName)
	w := &localConsumer{c: c, l: l, topic: fullTopic(opts.Topic), sub: opts.SubscriptionName, group: group,
		name: opts.Name, logger: c.o.Logger, nackDelay: opts.NackRedeliveryDelay, done: make(chan struct{}), timers: map[*time.Timer]struct{}{}}
	if w.nackDelay <= 0 {
		w.nackDelay = time.Minute // Pulsar's default
	}
	if opts.Type == pulsar.Exclusive {
		if w.excl, err = exclusiveLock(l.Name(), group); err != nil {
			return nil, err
		}
	}
	if w.g, err = l.JoinGroup(group, gc); err != nil {
		if w.excl != nil {
			w.excl.Close()
		}
		if opts.DLQ != nil {
			return nil, fmt.Errorf("ubpulsar: subscribe to %s (a local dead-letter topic's log is made by the first subscription with the DLQ policy; was it made before?): %w", w.topic, err)
		}
		return nil, fmt.Errorf("ubpulsar: subscribe to %s: %w", w.topic, err)
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	c.logsMu.Lock()
	if c.logsClosed {
		c.logsMu.Unlock()
		w.Close()
		return nil, fmt.Errorf("ubpulsar: client closed: %w", mq.ErrClosed)
	}
	if c.consumers == nil {
		c.consumers = map[*localConsumer]struct{}{}
	}
	c.consumers[w] = struct{}{}
	c.logsMu.Unlock()
	if opts.MessageChannel != nil {
		w.ch = opts.MessageChannel
		w.chanOnce.Do(w.startChan)
	}
	return w, nil
}

// localConsumer is a pulsar.Consumer of a local topic: a member of the
// log's consumer group named after the subscription.
type localConsumer struct {
	c                       *client
	l                       *mq.Log
	g                       *mq.Consumer
	topic, sub, group, name string
	nackDelay               time.Duration
	logger                  *slog.Logger
	excl                    *os.File

	recv     sync.Mutex // mq.Consumer.Receive is for one goroutine at a time
	chanOnce sync.Once
	ch       chan pulsar.ConsumerMessage
	ctx      context.Context // ended by Close
	cancel   context.CancelFunc
	done     chan struct{}
	wg       sync.WaitGroup
	closed   sync.Once

	mu     sync.Mutex
	timers map[*time.Timer]struct{} // delayed nacks
}

func (w *localConsumer) Subscription() string { return w.sub }
func (w *localConsumer) Name() string         { return w.name }

// Receive returns the next message of the partitions this consumer owns.
// A record that is not a local topic's (a hostile writer's) is logged
// and acked away.
func (w *localConsumer) Receive(ctx context.Context) (pulsar.Message, error) {
	w.recv.Lock()
	defer w.recv.Unlock()
	ctx, stop := mergeDone(ctx, w.ctx)
	defer stop()
	for {
		m, err := w.g.Receive(ctx)
		if err != nil {
			if w.ctx.Err() != nil {
				return nil, fmt.Errorf("ubpulsar: consumer closed: %w", mq.ErrClosed)
			}
			return nil, err
		}
		rec, err := decodeDelivered(m.Payload)
		if err != nil {
			w.logger.Error("ubpulsar: a record of a local topic does not decode; acked away", "topic", w.topic,
				"partition", m.Partition, "offset", m.Offset, "err", err)
			w.g.Ack(m)
			continue
		}
		d := m
		d.Payload = nil
		return &localMessage{topic: w.topic, rec: rec, attempt: m.Attempt,
			id: &localID{partition: int32(m.Partition), offset: m.Offset, delivery: &d, consumer: w}}, nil
	}
}

// decodeDelivered decodes a record as read from a local topic's log: a
// dead letter unwrapped, and the payload copied, since the record's
// bytes are the log's (valid until the next read).
func decodeDelivered(b []byte) (localRecord, error) {
	if dl, err := mq.ParseDeadLetter(b); err == nil {
		b = dl.Payload
	}
	rec, err := decodeLocal(b)
	if err != nil {
		return rec, err
	}
	rec.payload = append([]byte(nil), rec.payload...)
	return rec, nil
}

// mergeDone is ctx, ended also when other ends.
func mergeDone(ctx, other context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(other, cancel)
	return ctx, func() { stop(); cancel() }
}

// Chan delivers what Receive would, from a goroutine started at the
// first call (or at Subscribe, with ConsumerOptions.MessageChannel) and
// ended by Close.
func (w *localConsumer) Chan() <-chan pulsar.ConsumerMessage {
	w.chanOnce.Do(func() {
		w.ch = make(chan pulsar.ConsumerMessage)
		w.startChan()
	})
	return w.ch
}

func (w *localConsumer) startChan() {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			m, err := w.Receive(w.ctx)
			if err != nil {
				if w.ctx.Err() != nil {
					return
				}
				w.logger.Error("ubpulsar: local topic receive", "topic", w.topic, "err", err)
				t := time.NewTimer(100 * time.Millisecond) // not a spin on a lasting error
				select {
				case <-w.done:
					t.Stop()
					return
				case <-t.C:
				}
				continue
			}
			select {
			case w.ch <- pulsar.ConsumerMessage{Consumer: w, Message: m}:
			case <-w.done:
				w.NackID(m.ID())
				return
			}
		}
	}()
}

// delivery is the delivery behind id, if this consumer received it.
func (w *localConsumer) delivery(id pulsar.MessageID) (*mq.Message, error) {
	l, ok := id.(*localID)
	if !ok || l.delivery == nil || l.consumer != w {
		return nil, fmt.Errorf("ubpulsar: message id %v was not received by this consumer of %s", id, w.topic)
	}
	return l.delivery, nil
}

func (w *localConsumer) AckID(id pulsar.MessageID) error {
	d, err := w.delivery(id)
	if err != nil {
		return err
	}
	if err := w.g.Ack(*d); err != nil {
		return fmt.Errorf("ubpulsar: ack %v: %w", id, err)
	}
	return nil
}

func (w *localConsumer) Ack(m pulsar.Message) error {
	if m == nil {
		return errors.New("ubpulsar: ack of a nil message")
	}
	return w.AckID(m.ID())
}

func (w *localConsumer) AckIDList(ids []pulsar.MessageID) error {
	var errs []error
	for _, id := range ids {
		errs = append(errs, w.AckID(id))
	}
	return errors.Join(errs...)
}

// NackID gives the message back after ConsumerOptions.NackRedeliveryDelay
// (default one minute, as Pulsar's); it stays with this consumer until
// then.
func (w *localConsumer) NackID(id pulsar.MessageID) { w.nackAfter(id, w.nackDelay) }
func (w *localConsumer) Nack(m pulsar.Message) {
	if m != nil {
		w.NackID(m.ID())
	}
}

func (w *localConsumer) nackAfter(id pulsar.MessageID, delay time.Duration) {
	d, err := w.delivery(id)
	if err != nil {
		w.logger.Error("ubpulsar: nack", "err", err)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timers == nil { // closed: Close gave the message back
		return
	}
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		w.mu.Lock()
		_, live := w.timers[t]
		delete(w.timers, t)
		w.mu.Unlock()
		if live {
			w.g.Nack(*d)
		}
	})
	w.timers[t] = struct{}{}
}

// ReconsumeLater is a nack after delay (local topics have no retry topic).
func (w *localConsumer) ReconsumeLater(m pulsar.Message, delay time.Duration) {
	if m != nil {
		w.nackAfter(m.ID(), delay)
	}
}

func (w *localConsumer) ReconsumeLaterWithCustomProperties(m pulsar.Message, _ map[string]string, delay time.Duration) {
	w.ReconsumeLater(m, delay)
}

func (w *localConsumer) AckWithTxn(pulsar.Message, pulsar.Transaction) error {
	return fmt.Errorf("ubpulsar: transactions: %w", ErrLocalUnsupported)
}
func (w *localConsumer) AckCumulative(pulsar.Message) error {
	return fmt.Errorf("ubpulsar: cumulative acks: %w", ErrLocalUnsupported)
}
func (w *localConsumer) AckIDCumulative(pulsar.MessageID) error {
	return fmt.Errorf("ubpulsar: cumulative acks: %w", ErrLocalUnsupported)
}
func (w *localConsumer) Seek(pulsar.MessageID) error {
	return fmt.Errorf("ubpulsar: seek: %w", ErrLocalUnsupported)
}
func (w *localConsumer) SeekByTime(time.Time) error {
	return fmt.Errorf("ubpulsar: seek: %w", ErrLocalUnsupported)
}
func (w *localConsumer) GetLastMessageIDs() ([]pulsar.TopicMessageID, error) {
	return nil, fmt.Errorf("ubpulsar: last message ids: %w", ErrLocalUnsupported)
}

// Unsubscribe closes the consumer and deletes the subscription's group
// (members in other processes keep theirs until they close).
func (w *localConsumer) Unsubscribe() error {
	w.Close()
	if err := mq.RemoveGroup(w.l.Name(), w.group); err != nil {
		return fmt.Errorf("ubpulsar: unsubscribe %s: %w", w.sub, err)
	}
	return nil
}
func (w *localConsumer) UnsubscribeForce() error { return w.Unsubscribe() }

// Close leaves the group: the messages this consumer holds unacked
// (delayed nacks included) go back at once.
func (w *localConsumer) Close() {
	w.closed.Do(func() {
		close(w.done)
		w.cancel()
		w.mu.Lock()
		for t := range w.timers {
			t.Stop()
		}
		w.timers = nil
		w.mu.Unlock()
		w.wg.Wait()
		w.g.Close()
		if w.excl != nil {
			w.excl.Close()
		}
		w.c.logsMu.Lock()
		delete(w.c.consumers, w)
		w.c.logsMu.Unlock()
	})
}

// localPartitions is TopicPartitions for a local topic.
func (c *client) localPartitions(topic string) ([]string, error) {
	l, err := c.localLog(topic, false)
	if err != nil {
		return nil, err
	}
	n := l.Config().Partitions
	if n == 1 {
		return []string{fullTopic(topic)}, nil
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fullTopic(topic) + "-partition-" + strconv.Itoa(i)
	}
	return names, nil
}

var (
	_ pulsar.Producer  = (*localProducer)(nil)
	_ pulsar.Consumer  = (*localConsumer)(nil)
	_ pulsar.Message   = (*localMessage)(nil)
	_ pulsar.MessageID = (*localID)(nil)
)

// RemoveLocal deletes local topic topic: its log and the consumer groups
// of subscriptions subs. Processes that have them open keep their
// mappings.
func RemoveLocal(topic string, subs ...string) error {
	var errs []error
	for _, s := range subs {
		errs = append(errs, mq.RemoveGroup(LocalLogName(topic), localGroupName(s)))
	}
	return errors.Join(append(errs, mq.Remove(LocalLogName(topic)))...)
}
