//go:build !race

package procstat

const race = false
