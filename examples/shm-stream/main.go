// Command shm-stream streams records from this process to a child process
// through a shared-memory ring, then hands the child a 1 MiB buffer from a
// shared pool without copying it. It is the smallest complete use of
// ubkit's shm package across two processes.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

const (
	ringCap  = 1 << 20
	records  = 100_000
	childEnv = "SHM_STREAM_CHILD"
)

var poolConfig = shm.PoolConfig{Classes: []shm.PoolClass{{Size: 1 << 20, Count: 2}}}

func main() {
	var err error
	if name := os.Getenv(childEnv); name != "" {
		err = child(name)
	} else {
		err = parent()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shm-stream:", err)
		os.Exit(1)
	}
}

func parent() error {
	// Segments left by crashed earlier runs go first.
	if _, err := shm.Sweep(); err != nil {
		return err
	}
	poolSize, err := shm.PoolSize(poolConfig)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("example-stream-%d", os.Getpid())
	seg, err := shm.CreateSegment(name, shm.SPSCSize(ringCap)+poolSize, nil)
	if err != nil {
		return err
	}
	defer seg.Close() // the creator's Close also removes the name
	ring, err := shm.CreateSPSC(seg, 0, ringCap)
	if err != nil {
		return err
	}
	pool, err := shm.CreatePool(seg, shm.SPSCSize(ringCap), poolConfig)
	if err != nil {
		return err
	}
	producer, err := ring.Producer(shm.Wait{})
	if err != nil {
		return err
	}

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	for i := range uint64(records) {
		rec, err := producer.ClaimWait(ctx, 8)
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(rec, i)
		if i%64 == 63 {
			producer.Commit()
		}
	}
	producer.Commit()
	elapsed := time.Since(start)

	// Zero copy: fill a pool buffer in place and send only its handle.
	buf, err := pool.Loan(1 << 20)
	if err != nil {
		return err
	}
	copy(buf.Bytes(), "a megabyte that never gets copied")
	h, _ := buf.Handle().MarshalBinary()
	if err := producer.Send(ctx, h); err != nil {
		return err
	}
	producer.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("child: %w", err)
	}
	fmt.Printf("parent: sent %d records in %v (%.1f M records/s) and one 1 MiB buffer by handle\n",
		records, elapsed.Round(time.Microsecond), records/elapsed.Seconds()/1e6)
	return nil
}

func child(name string) error {
	seg, err := shm.OpenSegment(name)
	if err != nil {
		return err
	}
	defer seg.Close()
	ring, err := shm.OpenSPSC(seg, 0)
	if err != nil {
		return err
	}
	pool, err := shm.OpenPool(seg, shm.SPSCSize(ringCap))
	if err != nil {
		return err
	}
	consumer, err := ring.Consumer(shm.Wait{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := uint64(0); ; i++ {
		rec, err := consumer.NextWait(ctx)
		if errors.Is(err, shm.ErrClosed) {
			return fmt.Errorf("stream closed after %d records", i)
		}
		if err != nil {
			return err
		}
		if i == records {
			var h shm.Handle
			if err := h.UnmarshalBinary(rec); err != nil {
				return err
			}
			buf, err := pool.Adopt(h)
			if err != nil {
				return err
			}
			fmt.Printf("child: %d records in order, then a pool buffer saying %q\n", records, buf.Bytes()[:33])
			return buf.Return()
		}
		if got := binary.LittleEndian.Uint64(rec); got != i {
			return fmt.Errorf("record %d holds %d", i, got)
		}
		if i%64 == 63 {
			consumer.Release()
		}
	}
}
