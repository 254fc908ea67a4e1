package ubpulsar

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
)

func encodeLocal(r localRecord) []byte {
	b := make([]byte, r.size())
	r.encode(b)
	return b
}

func TestLocalRecord(t *testing.T) {
	r := localRecord{key: "k", orderingKey: "o", producer: "p", props: map[string]string{"b": "2", "a": "1", "": "empty"},
		eventTime: 5, publishTime: 6, seq: 7, payload: []byte("payload")}
	b := encodeLocal(r)
	got, err := decodeLocal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
	for i := range b {
		if _, err := decodeLocal(b[:i]); err == nil {
			t.Fatalf("a record cut at %d of %d bytes decoded", i, len(b))
		}
	}
	if _, err := decodeLocal(append(b, 0)); err == nil {
		t.Fatal("a record with a trailing byte decoded")
	}
	// Properties out of order (a and b swapped by hand) are refused.
	swapped := bytes.Replace(b, []byte{1, 0, 0, 0, 'a', 1, 0, 0, 0, '1', 1, 0, 0, 0, 'b', 1, 0, 0, 0, '2'},
		[]byte{1, 0, 0, 0, 'b', 1, 0, 0, 0, '2', 1, 0, 0, 0, 'a', 1, 0, 0, 0, '1'}, 1)
	if bytes.Equal(swapped, b) {
		t.Fatal("the test did not find the properties")
	}
	if _, err := decodeLocal(swapped); err == nil {
		t.Fatal("properties out of order decoded")
	}
}

// FuzzLocalRecord: any bytes decode or fail without panicking, and what
// decodes re-encodes to the same bytes (the encoding is canonical).
func FuzzLocalRecord(f *testing.F) {
	f.Add(encodeLocal(localRecord{payload: []byte("x")}))
	f.Add(encodeLocal(localRecord{key: "key", props: map[string]string{"a": "1", "b": "2"}, payload: make([]byte, 100)}))
	f.Add([]byte{})
	f.Add(make([]byte, localFixed))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeLocal(b)
		if err != nil {
			return
		}
		if again := encodeLocal(r); !bytes.Equal(again, b) {
			t.Fatalf("decoded %q, re-encoded %q", b, again)
		}
	})
}

// TestLocalNames: the longest topic and subscription names still make
// valid segment names for the log, its segments and the group.
func TestLocalNames(t *testing.T) {
	long := strings.Repeat("x/y:", 100)
	topic := "persistent://public/default/" + long
	c, err := NewClient(clientOptions("pulsar://127.0.0.1:1"), Options{Local: LocalConfig{Topics: []string{topic}, Log: mq.Config{SegmentSize: 4096, Segments: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	defer RemoveLocal(topic, long)
	defer c.Close()
	s, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: long})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if LocalLogName(topic) == LocalLogName(topic+"x") || localGroupName("a/b") == localGroupName("a_b") {
		t.Fatal("names that map alike are not told apart")
	}
}
