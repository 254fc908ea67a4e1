package discovery

import (
	"io/fs"
	"path"
	"strings"
)

// watchedDirs are the directories whose entries say which devices a node
// has: a device that comes or goes adds or removes one of their entries
// (its /dev node, its uacce or PCI directory, its directory in the NVIDIA
// driver's /proc), so comparing their names finds it without a scan. keep
// selects the entries that matter; nil keeps all.
var watchedDirs = []struct {
	dir  string
	keep func(name string) bool
}{
	{"dev", func(name string) bool { return strings.HasPrefix(name, "davinci") || strings.HasPrefix(name, "nvidia") }},
	{"sys/class/uacce", nil},
	{"sys/bus/pci/devices", nil},
	{"proc/driver/nvidia/gpus", nil},
	{"sys/kernel/mm/hugepages", nil},
}

// deviceState is a cheap summary of what the devices are: the names in
// watchedDirs and each huge page pool's size (nr_hugepages, not its free
// count). Two equal states mean no device came or went; a scan finds what
// else changed. It lists a few directories and reads a few small files;
// what it cannot read counts as empty.
func deviceState(fsys fs.FS) string {
	var b strings.Builder
	for _, w := range watchedDirs {
		ents, _ := fs.ReadDir(fsys, w.dir)
		for _, e := range ents {
			if w.keep == nil || w.keep(e.Name()) {
				b.WriteString(w.dir + "/" + e.Name() + "\n")
			}
		}
	}
	const hugepages = "sys/kernel/mm/hugepages"
	s := &scanner{fsys: fsys}
	ents, _ := fs.ReadDir(fsys, hugepages)
	for _, e := range ents {
		p := path.Join(hugepages, e.Name(), "nr_hugepages")
		if data, ok, err := s.read(p); ok && err == nil {
			b.WriteString(p + "=" + strings.TrimSpace(data) + "\n")
		}
	}
	return b.String()
}
