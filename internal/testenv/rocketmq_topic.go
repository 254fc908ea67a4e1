package testenv

import (
	"context"
	"fmt"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// CreateTopic creates topic on the broker with queues read and write
// queues and waits until the name server has its route: the broker
// registers a topic with the name server on its own time (under load
// seconds after "boot success") and the name server tells nobody, so a
// producer started before would find no route.
func (r *RocketMQ) CreateTopic(ctx context.Context, topic string, queues int) error {
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{r.NamesrvAddr})))
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(r.BrokerAddr),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues)); err != nil {
		return fmt.Errorf("testenv: create topic %s: %w", topic, err)
	}
	return r.waitRoute(ctx, a, topic, queues)
}

// WaitTopic waits until the name server has a route of topic, as after a
// Restart: the broker registers its topics again on its own time.
func (r *RocketMQ) WaitTopic(ctx context.Context, topic string) error {
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{r.NamesrvAddr})))
	if err != nil {
		return err
	}
	defer a.Close()
	return r.waitRoute(ctx, a, topic, 0)
}

// waitRoute asks the name server for topic's route until it has queues
// queues (any, if 0).
func (r *RocketMQ) waitRoute(ctx context.Context, a admin.Admin, topic string, queues int) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		qs, err := a.FetchPublishMessageQueues(ctx, topic)
		if err == nil && (len(qs) == queues || queues == 0 && len(qs) > 0) {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("testenv: the name server has no route of %s with %d queues: %v (%d queues): %w", topic, queues, err, len(qs), ctx.Err())
		}
	}
}
