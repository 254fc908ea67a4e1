// Package examplescheck holds no code, only a test that keeps ubkit's
// examples copyable: the programs under examples/ and every package's
// Example functions (example_test.go) may import only ubkit's public
// packages, so a user can copy one out of the repository and build it
// against the module.
package examplescheck
