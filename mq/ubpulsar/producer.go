package ubpulsar

import (
	"context"
	"fmt"
	"maps"

	"github.com/apache/pulsar-client-go/pulsar"
)

// producer offloads large payloads of its topic; everything else is the
// upstream producer's.
type producer struct {
	pulsar.Producer
	c *client
}

// offload returns the message to send for msg: msg itself, or a copy
// whose payload is a reference to msg's payload in the store.
func (p *producer) offload(ctx context.Context, msg *pulsar.ProducerMessage) (*pulsar.ProducerMessage, error) {
	if msg == nil || msg.Value != nil || len(msg.Payload) <= p.c.o.Threshold {
		return msg, nil
	}
	ref, err := p.c.o.Store.Put(ctx, msg.Payload)
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: offload a %d-byte payload: %w", len(msg.Payload), err)
	}
	b, err := ref.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: %w", err)
	}
	m := *msg
	m.Payload = b
	m.Properties = maps.Clone(msg.Properties)
	if m.Properties == nil {
		m.Properties = map[string]string{}
	}
	m.Properties[PropertyOffload] = "1"
	return &m, nil
}

func (p *producer) Send(ctx context.Context, msg *pulsar.ProducerMessage) (pulsar.MessageID, error) {
	m, err := p.offload(ctx, msg)
	if err != nil {
		return nil, err
	}
	return p.Producer.Send(ctx, m)
}

// SendAsync offloads synchronously (a copy into shared memory) and sends
// asynchronously; the callback gets the caller's message.
func (p *producer) SendAsync(ctx context.Context, msg *pulsar.ProducerMessage, callback func(pulsar.MessageID, *pulsar.ProducerMessage, error)) {
	m, err := p.offload(ctx, msg)
	if err != nil {
		if callback != nil {
			callback(nil, msg, err)
		}
		return
	}
	p.Producer.SendAsync(ctx, m, func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
		if callback != nil {
			callback(id, msg, err)
		}
	})
}
