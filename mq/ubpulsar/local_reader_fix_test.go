package ubpulsar

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
)

// TestLocalReaderCreateVsClose: CreateReader racing with the client's
// Close either gets a reader (closed by Close) or fails with
// mq.ErrClosed; it never reads a log Close unmapped (a SIGSEGV, as a
// review found: the reader was registered only after its positions).
func TestLocalReaderCreateVsClose(t *testing.T) {
	for range 30 {
		topic := "persistent://public/default/" + unique("local-rclose")
		c, err := NewClient(clientOptions("pulsar://127.0.0.1:1"), localOptions(1, topic))
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		sendLocal(t, timeout(t, time.Minute), p, 0, 200)
		p.Close()
		var wg sync.WaitGroup
		started := make(chan struct{}, 4)
		for range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					r, err := c.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
					if err != nil {
						if !errors.Is(err, mq.ErrClosed) {
							t.Errorf("CreateReader: %v", err)
						}
						return
					}
					r.Close()
					if i == 0 {
						started <- struct{}{}
					}
				}
			})
		}
		for range 4 {
			<-started
		}
		c.Close()
		wg.Wait()
		mq.Remove(LocalLogName(topic))
	}
}
