//go:build race

package procstat

const race = true
