//go:build linux

package shm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procDir is where Sweep reads which files processes have mapped or open.
const procDir = "/proc"

// fileID names a file: its device and inode.
type fileID struct{ dev, ino uint64 }

func statID(st *unix.Stat_t) fileID { return fileID{uint64(st.Dev), st.Ino} }

// inUse is the set of files on ShmDir's file system that live processes
// have mapped (/proc/<pid>/maps) or open (/proc/<pid>/fd). Processes whose
// entries the caller may not read are not in it: for a user other than
// root, those of other users, who cannot open this user's 0600 segments by
// name anyway. Zombies have neither mappings nor descriptors.
type inUse map[fileID]bool

// scanInUse builds the inUse set. It fails if it cannot list processes at
// all, so that Sweep, unable to tell, removes nothing. The descriptors of
// held, Sweep's own, do not count.
func scanInUse(held []sweepCandidate) (inUse, error) {
	var st unix.Stat_t
	if err := unix.Stat(ShmDir, &st); err != nil {
		return nil, fmt.Errorf("shm: sweep: %w", err)
	}
	dev := uint64(st.Dev)
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("shm: sweep: cannot tell which segments processes use: %w (is /proc mounted?)", err)
	}
	self := strconv.Itoa(os.Getpid())
	ignore := map[string]bool{}
	for _, c := range held {
		ignore[procDir+"/"+self+"/fd/"+strconv.Itoa(c.fd)] = true
	}
	used := inUse{}
	seen := 0
	for _, e := range entries {
		if _, err := strconv.ParseUint(e.Name(), 10, 31); err != nil {
			continue
		}
		seen++
		dir := procDir + "/" + e.Name()
		used.addMaps(dir+"/maps", dev)
		used.addFds(dir+"/fd", dev, ignore)
	}
	if seen == 0 {
		return nil, errors.New("shm: sweep: cannot tell which segments processes use: " + procDir + " lists no process (is /proc mounted?)")
	}
	return used, nil
}

// addMaps adds the files on device dev that the maps file lists: lines of
// "address perms offset major:minor inode path", numbers in hex but the
// inode.
func (u inUse) addMaps(path string, dev uint64) {
	f, err := os.Open(path)
	if err != nil {
		return // gone, or not ours to read
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[4] == "0" {
			continue // anonymous memory
		}
		majText, minText, ok := strings.Cut(fields[3], ":")
		maj, err1 := strconv.ParseUint(majText, 16, 32)
		minor, err2 := strconv.ParseUint(minText, 16, 32)
		ino, err3 := strconv.ParseUint(fields[4], 10, 64)
		if !ok || err1 != nil || err2 != nil || err3 != nil || unix.Mkdev(uint32(maj), uint32(minor)) != dev {
			continue
		}
		u[fileID{dev, ino}] = true
	}
}

// addFds adds the files on device dev that the process has open, but for
// the descriptors (paths in dir) in ignore.
func (u inUse) addFds(dir string, dev uint64, ignore map[string]bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		path := dir + "/" + e.Name()
		if ignore[path] {
			continue
		}
		// Sockets, pipes and anonymous files read as "socket:[...]" and
		// the like; files as paths.
		if target, err := os.Readlink(path); err != nil || !strings.HasPrefix(target, "/") {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && uint64(st.Dev) == dev {
			u[statID(&st)] = true
		}
	}
}
