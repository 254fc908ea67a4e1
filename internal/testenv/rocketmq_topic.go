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
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		qs, err := a.FetchPublishMessageQueues(ctx, topic)
		if err == nil && len(qs) == queues {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("testenv: the name server has no route of %s with %d queues: %v (%d queues): %w", topic, queues, err, len(qs), ctx.Err())
		}
	}
}
