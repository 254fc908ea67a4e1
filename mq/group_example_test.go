package mq_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/ubkit-io/ubkit/mq"
)

// Members of a consumer group share a log's partitions; each message is
// acked, or nacked for redelivery, and after MaxAttempts deliveries it
// goes to a dead-letter log.
func ExampleLog_JoinGroup() {
	name := "example-group-" + strconv.Itoa(os.Getpid())
	log, err := mq.Create(name, mq.Config{Partitions: 2, SegmentSize: 1 << 20, Segments: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.Remove(name)
	defer log.Close()
	dlq, err := mq.Create(name+"-dlq", mq.Config{SegmentSize: 2 << 20}) // room for the header
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.Remove(name + "-dlq")
	defer dlq.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	g, err := log.JoinGroup("scorers", mq.GroupConfig{MaxAttempts: 2, DeadLetter: dlq})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.RemoveGroup(name, "scorers")
	defer g.Close()
	log.Send(ctx, 0, []byte("good"))
	log.Send(ctx, 1, []byte("poison"))
	for range 3 {
		m, err := g.Receive(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("partition %d offset %d attempt %d: %s\n", m.Partition, m.Offset, m.Attempt, m.Payload)
		if string(m.Payload) == "poison" {
			g.Nack(m)
		} else {
			g.Ack(m)
		}
	}
	// The second nack sends it to the dead-letter log, which the next
	// Receive does before it waits for more.
	short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	defer stop()
	g.Receive(short)

	r, err := dlq.NewReader(0, mq.Oldest)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	rec, err := r.Next(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := mq.ParseDeadLetter(rec.Payload)
	fmt.Printf("dead letter: partition %d offset %d after %d attempts: %s %v\n", d.Partition, d.Offset, d.Attempts, d.Payload, err)
	// Output:
	// partition 0 offset 0 attempt 1: good
	// partition 1 offset 0 attempt 1: poison
	// partition 1 offset 0 attempt 2: poison
	// dead letter: partition 1 offset 0 after 2 attempts: poison <nil>
}
