package bench

import (
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	RunPeerIfChild()
	testenv.Main(m)
}
