package memcached

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// The differential test's size. make test runs the defaults (a few
// seconds); a longer run: go test -run Differential ./cache/memcached
// -mcdiff.ops=20000 -mcdiff.seconds=600, or the UBKIT_MC_DIFF_* variables.
var (
	diffSeed    = flag.Uint64("mcdiff.seed", envUint("UBKIT_MC_DIFF_SEED", 0), "seed of TestDifferentialPymemcache (0: a new one, printed)")
	diffOps     = flag.Uint64("mcdiff.ops", envUint("UBKIT_MC_DIFF_OPS", 300), "operations per pymemcache client")
	diffClients = flag.Uint64("mcdiff.clients", envUint("UBKIT_MC_DIFF_CLIENTS", 3), "pymemcache clients at once")
	diffRaw     = flag.Uint64("mcdiff.raw", envUint("UBKIT_MC_DIFF_RAW", 150), "raw malformed-input cases")
	diffSeconds = flag.Uint64("mcdiff.seconds", envUint("UBKIT_MC_DIFF_SECONDS", 15), "time after which no new operation starts")
)

func envUint(name string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// TestDifferentialPymemcache runs testdata/diff.py: long random sequences
// of commands through pymemcache (a client that is not ours) from
// several threads, each in its own key space, plus malformed input on a
// raw socket, against real memcached and against this server, requiring
// the same answer to every command. The seed is printed; rerun a failure
// with -mcdiff.seed.
func TestDifferentialPymemcache(t *testing.T) {
	python, pythonPath, err := testenv.Pymemcache()
	if err != nil {
		t.Fatal(err)
	}
	real, err := testenv.StartMemcached()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { real.Close() })
	ours := serveLarge(t)
	seed := *diffSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<31) + 1
	}
	t.Logf("seed %d (replay: go test -run TestDifferentialPymemcache ./cache/memcached -mcdiff.seed=%d)", seed, seed)
	limit := time.Duration(*diffSeconds)*time.Second + 2*time.Minute // the last operations, and a slow machine
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "testdata/diff.py", "--real", real.Addr, "--ours", ours,
		"--seed", fmt.Sprint(seed), "--ops", fmt.Sprint(*diffOps), "--clients", fmt.Sprint(*diffClients),
		"--raw-ops", fmt.Sprint(*diffRaw), "--seconds", fmt.Sprint(*diffSeconds))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPath, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("seed %d: %v (%v):\n%s", seed, err, ctx.Err(), out)
	}
	t.Logf("%s", out)
}

// TestDiffDriver runs testdata/diff.py's check of the commands it makes
// (no server needed): a set_many has at most one value too large, last.
// pymemcache gives up on a set_many at its first error and closes the
// connection with the later sets in flight, which a server may run after
// the next command, on a new connection: with a value too large before
// other sets, each server's answer to the get_many after it depended on
// how fast it got through the old connection's pipeline (a flake of
// TestDifferentialPymemcache under -race, either server lagging).
func TestDiffDriver(t *testing.T) {
	python, pythonPath, err := testenv.Pymemcache()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "testdata/diff.py", "--selftest")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonPath, "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// serveLarge starts a server on a fresh pool as large as the memcached
// that testenv starts (-m 256), so that neither evicts what the other
// keeps.
func serveLarge(t *testing.T) string {
	t.Helper()
	addr, _ := serveWith(t, 256<<20, nil, nil)
	return addr
}
