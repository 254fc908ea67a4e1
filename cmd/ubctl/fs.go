package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/ubkit-io/ubkit/fs"
	"github.com/ubkit-io/ubkit/fs/safetensors"
	"github.com/ubkit-io/ubkit/internal/osproc"
)

// fsCmd is `ubctl fs load FILE`: load a file as fs.Open does, with a
// progress bar, and say how fast.
func fsCmd(args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "load" {
		return errors.New("usage: ubctl fs load [-method auto|map|copy] [-parallel N] [-chunk MiB] [-direct] [-private] [-cold] [-sha256 HEX] [-tensors] [-hold] FILE")
	}
	fl := flag.NewFlagSet("fs load", flag.ContinueOnError)
	method := fl.String("method", "auto", "auto, map (map the file, fault its pages in) or copy (parallel reads into the host's shared copy)")
	parallel := fl.Int("parallel", 16, "goroutines reading or faulting pages in at once")
	chunk := fl.Int("chunk", 8, "the unit of parallel work, MiB")
	direct := fl.Bool("direct", false, "copy: read with O_DIRECT (a shared copy of a cold file of 16 MiB or more on a local disk is, without it)")
	buffered := fl.Bool("buffered", false, "copy: read a cold file through the page cache all the same (-direct wins)")
	private := fl.Bool("private", false, "copy: a copy of this process's own, not the host's shared one")
	cold := fl.Bool("cold", false, "drop the file's pages from the page cache first (fadvise DONTNEED)")
	sum := fl.String("sha256", "", "the expected SHA-256 of the content")
	tensors := fl.Bool("tensors", false, "parse the file as safetensors and summarize its tensors")
	hold := fl.Bool("hold", false, "keep the file loaded until interrupted or terminated (other processes then share the copy)")
	fl.SetOutput(out)
	if err := fl.Parse(args[1:]); err != nil {
		return err
	}
	if fl.NArg() != 1 {
		return errors.New("fs load: one FILE wanted")
	}
	path := fl.Arg(0)
	o := &fs.Options{Parallel: *parallel, ChunkSize: *chunk << 20, Direct: *direct, Buffered: *buffered, Private: *private, SHA256: *sum}
	switch *method {
	case "auto":
	case "map":
		o.Method = fs.Map
	case "copy":
		o.Method = fs.Copy
	default:
		return fmt.Errorf("fs load: unknown method %q", *method)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if *cold {
		if err := fs.Evict(path); err != nil {
			return fmt.Errorf("fs load: dropping %s from the page cache: %w", path, err)
		}
	}
	bar := progressbar.NewOptions64(st.Size(),
		progressbar.OptionSetDescription("loading "+path),
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(65*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	o.Progress = func(p fs.Progress) {
		if p.Waiting {
			bar.Describe("another process is loading " + path)
		}
		bar.Set64(p.Done)
	}
	// SIGTERM too: a held shared copy is removed by its last holder's
	// Close, which a process killed by a signal never runs.
	ctx, stop := osproc.StopContext(context.Background())
	defer stop()
	start := time.Now()
	f, err := fs.Open(ctx, path, o)
	took := time.Since(start)
	bar.Finish()
	if err != nil {
		return err
	}
	defer f.Close()
	shared := "private"
	if f.Shared() {
		shared = "shared with every process of this user on the host"
	}
	fmt.Fprintf(out, "%s: %s in %v: %.2f GB/s (%v, %s)\n", path, bytesString(f.Size()), took.Round(time.Microsecond),
		float64(f.Size())/took.Seconds()/1e9, f.Method(), shared)
	if *tensors {
		h, err := safetensors.Parse(f.Bytes())
		if err != nil {
			return err
		}
		byType := map[safetensors.DType]int64{}
		for _, t := range h.Tensors {
			byType[t.DType] += int64(len(t.Data))
		}
		var parts []string
		for d, n := range byType {
			parts = append(parts, fmt.Sprintf("%s %s", d, bytesString(n)))
		}
		slices.Sort(parts)
		fmt.Fprintf(out, "%d tensors (%s), %d metadata entries\n", len(h.Tensors), strings.Join(parts, ", "), len(h.Metadata))
	}
	if *hold {
		fmt.Fprintln(out, "holding it loaded; interrupt to let go")
		<-ctx.Done()
	}
	return nil
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
