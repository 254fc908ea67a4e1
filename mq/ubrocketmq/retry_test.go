package ubrocketmq

import (
	"context"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq/offload"
)

// runRetries sends n messages (bodies below and above threshold) to a
// new topic and consumes them, returning ConsumeRetryLater the first time
// each even message arrives: the reconsume counts each message arrived
// with, in order. It checks every body.
func runRetries(t *testing.T, b *testenv.RocketMQ, o *Options, topic string, n, threshold int) map[int][]int32 {
	createTopic(t, b, topic, 1)
	ctx := timeout(t, 3*time.Minute)
	sizes := []int{100, threshold + 1, 4 * threshold}
	body := func(i int) []byte { return sent{size: sizes[i%len(sizes)], seed: uint64(i)}.payload() }
	p := newProducer(t, b, o)
	for i := range n {
		m := primitive.NewMessage(topic, body(i))
		m.WithProperty("i", strconv.Itoa(i))
		if _, err := p.SendSync(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[int][]int32{}
	bad := ""
	done, acked := make(chan struct{}), 0
	consume(t, b, o, topic, unique("retry-g"), func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		m := msgs[0]
		i, _ := strconv.Atoi(m.GetProperty("i"))
		if want := body(i); bench.Sum(m.Body) != bench.Sum(want) || len(m.Body) != len(want) {
			bad = "message " + strconv.Itoa(i) + ": not the body sent"
		}
		got[i] = append(got[i], m.ReconsumeTimes)
		if i%2 == 0 && len(got[i]) == 1 {
			return consumer.ConsumeRetryLater, nil
		}
		if acked++; acked == n {
			close(done)
		}
		return consumer.ConsumeSuccess, nil
	}, consumer.WithConsumeMessageBatchMaxSize(1))
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d consumed: %v", acked, n, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != "" {
		t.Fatal(bad)
	}
	return got
}

// testRetryDifferential: retries through the drop-in (offload on) and
// through the plain client, side by side on the same broker: the same
// reconsume counts per message, the retried bodies resolved again.
func testRetryDifferential(t *testing.T, b *testenv.RocketMQ) {
	const threshold, n = 8 << 10, 6
	s := store(t, offload.StoreConfig{SegmentSize: 4 << 20})
	topicUB, topicPlain := unique("retry-ub"), unique("retry-plain")
	var ub, pl map[int][]int32
	t.Run("both", func(t *testing.T) {
		t.Run("ubkit", func(t *testing.T) {
			t.Parallel()
			ub = runRetries(t, b, &Options{Topics: []string{topicUB}, Threshold: threshold, Store: s}, topicUB, n, threshold)
		})
		t.Run("plain", func(t *testing.T) {
			t.Parallel()
			pl = runRetries(t, b, nil, topicPlain, n, threshold)
		})
	})
	if t.Failed() {
		return
	}
	if !reflect.DeepEqual(ub, pl) {
		t.Fatalf("reconsume counts: drop-in %v, plain %v", ub, pl)
	}
	t.Logf("%d messages: reconsume counts %v, alike", n, ub)
}
