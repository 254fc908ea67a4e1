package fs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/transport"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov" // the ub path's provider between the namespaces
)

func init() {
	testenv.RegisterChild("fs-export", fsExportChild)
	testenv.RegisterChild("fs-remote", fsRemoteChild)
}

// fsExportChild exports FS_DIR as ub://n0/models with the default
// endpoint (the environment says which node, topology, provider and
// identity), says "listening", serves until its standard input ends,
// and prints its registrations and bytes streamed.
func fsExportChild() int {
	e, err := Export(os.Getenv("FS_DIR"), nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	l, err := transport.Listen(context.Background(), "ub://n0/models")
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	go e.Serve(l)
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	e.Close()
	l.Close()
	st := e.Stats()
	fmt.Printf("maps=%d streamed=%d\n", st.Maps, st.Streamed)
	return 0
}

// fsRemoteChild opens FS_URL with OpenRemote (the default endpoint), and
// prints "ok <sha256> <paths taken>" or "error <why>". The export's
// registry may not listen yet: it tries for 20 s.
func fsRemoteChild() int {
	var paths sync.Map
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := transport.Dial(ctx, addr)
		if err == nil {
			paths.Store(string(c.Path()), true)
		}
		return c, err
	}
	var f *File
	var err error
	// Nothing tells when the export's registry listens: polled every
	// 50 ms, for 20 s at most.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(20 * time.Second); ; <-tick.C {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		f, err = OpenRemote(ctx, os.Getenv("FS_URL"), &RemoteOptions{Dial: dial})
		cancel()
		if err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer f.Close()
	var names []string
	paths.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
	sort.Strings(names)
	fmt.Println("ok", sum(f.Bytes()), strings.Join(names, ","))
	return 0
}

// TestRemoteAcrossNetns reads a file exported in one network namespace
// (node n0) from another (node n1): two hosts joined by a veth pair,
// transport's ub path over the tcp provider, node identities checked
// with TLS.
func TestRemoteAcrossNetns(t *testing.T) {
	p := testenv.NewNetnsPair(t)
	dir := t.TempDir()
	topo, err := testenv.TwoHostTopology(dir, "sn1", p.AddrA, p.AddrB)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := testenv.NewNodeCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	env := func(node, addr string) []string {
		id, err := ca.Issue("sn1", node)
		if err != nil {
			t.Fatal(err)
		}
		return append(id, "UB_TOPOLOGY="+topo, "UB_NODE="+node, "UB_PROVIDER=tcp", "UB_TCP_LISTEN="+addr+":0",
			"UBKIT_RUNTIME_DIR="+filepath.Join(dir, node))
	}
	files := filepath.Join(dir, "models")
	os.Mkdir(files, 0o755)
	_, want := writeFile(t, files, 9<<20+3, 41)
	name := fmt.Sprintf("f-%d-41", len(want))

	exp := p.Child(t, p.A, "fs-export", append(env("n0", p.AddrA), "FS_DIR="+files)...)
	in, err := exp.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	exp.Stderr = os.Stderr
	if err := exp.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); exp.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "listening" {
		t.Fatalf("export: %q", sc.Text())
	}
	rd := p.Child(t, p.B, "fs-remote", append(env("n1", p.AddrB), "FS_URL=ub://n0/models/"+name)...)
	rd.Stderr = os.Stderr
	got, err := rd.Output()
	if err != nil {
		t.Fatalf("reader: %v: %s", err, got)
	}
	if want := "ok " + sum(want) + " ub\n"; string(got) != want {
		t.Errorf("reader in the other namespace said %q, want %q", got, want)
	}
	// The reader took one-sided reads over the tcp provider: nothing
	// came through the connection.
	in.Close()
	if !sc.Scan() || sc.Text() != "maps=1 streamed=0" {
		t.Errorf("export: %q, want one registration and nothing streamed", sc.Text())
	}
}
