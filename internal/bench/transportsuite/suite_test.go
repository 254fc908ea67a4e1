package transportsuite

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

func TestMain(m *testing.M) { benchtest.Main(m) }

// TestCasesRun runs every contender briefly across processes, the
// connect-close cases with 20 connections rather than 1,000.
func TestCasesRun(t *testing.T) {
	cases := slices.DeleteFunc(Cases(), func(c bench.Case) bool { return strings.HasPrefix(c.Name, "connect-close-") })
	benchtest.CasesRun(t, append(cases, connectCloseCases(20)...), 30*time.Millisecond)
}
