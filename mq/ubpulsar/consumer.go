package ubpulsar

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq/offload"
)

// message is a received message whose reference was resolved: Payload
// is the original payload and Properties lack PropertyOffload; the rest
// is the broker's message.
type message struct {
	pulsar.Message
	payload []byte
	props   map[string]string
}

func (m *message) Payload() []byte               { return m.payload }
func (m *message) Properties() map[string]string { return m.props }
func (m *message) GetSchemaValue(any) error {
	return fmt.Errorf("ubpulsar: an offloaded payload has no schema")
}

// unwrap is the upstream message behind m.
func unwrap(m pulsar.Message) pulsar.Message {
	if w, ok := m.(*message); ok {
		return w.Message
	}
	return m
}

// resolve returns msg with its reference resolved, msg itself if it is
// not offloaded, or an error (the reference is bad or its payload gone).
func (c *client) resolve(ctx context.Context, msg pulsar.Message) (pulsar.Message, error) {
	props := msg.Properties()
	if props[PropertyOffload] == "" {
		return msg, nil
	}
	ref, err := offload.ParseRef(msg.Payload())
	if err != nil {
		return nil, err
	}
	b, err := c.o.Resolver.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	p := maps.Clone(props)
	delete(p, PropertyOffload)
	return &message{Message: msg, payload: b, props: p}, nil
}

// consumer resolves the references it receives; everything else is the
// upstream consumer's.
type consumer struct {
	pulsar.Consumer
	c *client

	chanOnce sync.Once
	ch       chan pulsar.ConsumerMessage
	done     chan struct{}
	closed   sync.Once
	wg       sync.WaitGroup
}

// failed logs a message that could not be resolved and nacks it: the
// broker redelivers it (and, with a DLQ policy, gives it up after the
// policy's redeliveries), and the user never sees it empty.
func (w *consumer) failed(msg pulsar.Message, err error) {
	w.c.o.Logger.Error("ubpulsar: an offloaded payload could not be resolved; message nacked",
		"topic", msg.Topic(), "id", msg.ID().String(), "redeliveries", msg.RedeliveryCount(), "err", err)
	w.Consumer.Nack(msg)
}

func (w *consumer) Receive(ctx context.Context) (pulsar.Message, error) {
	for {
		msg, err := w.Consumer.Receive(ctx)
		if err != nil {
			return nil, err
		}
		m, err := w.c.resolve(ctx, msg)
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil {
			w.Consumer.Nack(msg)
			return nil, ctx.Err()
		}
		w.failed(msg, err)
	}
}

// Chan is the upstream Chan with references resolved (by a goroutine
// started at the first call, ended by Close).
func (w *consumer) Chan() <-chan pulsar.ConsumerMessage {
	w.chanOnce.Do(func() {
		if w.ch != nil { // the user's MessageChannel, already forwarded into
			return
		}
		w.ch = make(chan pulsar.ConsumerMessage)
		w.startForward(w.Consumer.Chan(), w.ch)
	})
	return w.ch
}

func (w *consumer) startForward(from <-chan pulsar.ConsumerMessage, to chan<- pulsar.ConsumerMessage) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-w.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		for {
			var cm pulsar.ConsumerMessage
			var ok bool
			select {
			case cm, ok = <-from:
				if !ok {
					return
				}
			case <-w.done:
				return
			}
			m, err := w.c.resolve(ctx, cm.Message)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				w.failed(cm.Message, err)
				continue
			}
			select {
			case to <- pulsar.ConsumerMessage{Consumer: w, Message: m}:
			case <-w.done:
				return
			}
		}
	}()
}

func (w *consumer) Close() {
	w.closed.Do(func() { close(w.done) })
	w.Consumer.Close()
	w.wg.Wait()
}

func (w *consumer) Ack(m pulsar.Message) error { return w.Consumer.Ack(unwrap(m)) }
func (w *consumer) AckWithTxn(m pulsar.Message, txn pulsar.Transaction) error {
	return w.Consumer.AckWithTxn(unwrap(m), txn)
}
func (w *consumer) AckCumulative(m pulsar.Message) error { return w.Consumer.AckCumulative(unwrap(m)) }
func (w *consumer) Nack(m pulsar.Message)                { w.Consumer.Nack(unwrap(m)) }

// ReconsumeLater republishes the message as received (its reference,
// marked), so the retry topic's consumers resolve it too.
func (w *consumer) ReconsumeLater(m pulsar.Message, delay time.Duration) {
	w.Consumer.ReconsumeLater(unwrap(m), delay)
}
func (w *consumer) ReconsumeLaterWithCustomProperties(m pulsar.Message, props map[string]string, delay time.Duration) {
	w.Consumer.ReconsumeLaterWithCustomProperties(unwrap(m), props, delay)
}

// reader resolves the references it reads; one whose payload is gone is
// an error (a reader has no nack).
type reader struct {
	pulsar.Reader
	c *client
}

func (r *reader) Next(ctx context.Context) (pulsar.Message, error) {
	msg, err := r.Reader.Next(ctx)
	if err != nil {
		return nil, err
	}
	m, err := r.c.resolve(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: message %s of %s: %w", msg.ID(), msg.Topic(), err)
	}
	return m, nil
}
