// Package layers holds the test that keeps ubkit's layers apart: imports
// point down only (shm < ub < transport < adapters < programs), adapters
// stay independent of each other, library packages leave the choice of a
// ub provider to programs, and unsafe and raw system calls stay in shm,
// the providers and a few listed helpers. The rules and the table of
// packages are in layers_test.go; the package has no other code.
package layers
