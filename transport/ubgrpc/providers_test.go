package ubgrpc_test

// The ub provider these tests' ub path uses (the default, "tcp"). A
// program chooses its providers by importing them, as it does
// database/sql drivers, and so do the tests.
import _ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
