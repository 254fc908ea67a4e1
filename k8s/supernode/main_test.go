package supernode

import (
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
