package transport

// The ub providers these tests use. A program chooses its providers by
// importing them, as it does database/sql drivers, and so do the tests.
import (
	_ "github.com/ubkit-io/ubkit/ub/provider/simprov"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
)
