package shm

// The types of the file helpers (fileio.go), the same on every system;
// the calls fail with errors.ErrUnsupported outside Linux.

// FileStat is what identifies an open file's content to a cache of it:
// the file (Dev, Ino), its Size and modification time, and the type of
// the file system it is on.
type FileStat struct {
	Dev, Ino uint64
	Size     int64
	// Mtime and Ctime are the modification and status-change times in
	// nanoseconds since the epoch: a file rewritten in place keeps its
	// inode and changes these.
	Mtime, Ctime int64
	// Mode is st_mode: the type bits and the permissions.
	Mode uint32
	// FSType is statfs(2)'s f_type (FSTmpfs, FSNFS, ...).
	FSType int64
}

// File system types of FileStat.FSType (statfs(2) magic numbers) that
// choose how a file is loaded.
const (
	FSTmpfs     = 0x01021994
	FSRamfs     = 0x858458f6
	FSHugetlbfs = 0x958458f6
	FSNFS       = 0x6969
	FSFuse      = 0x65735546
	FSCIFS      = 0xff534d42
	FSSMB2      = 0xfe534d42
	FSCeph      = 0x00c36400
	FS9P        = 0x01021997
	FSOverlay   = 0x794c7630
	FSExt4      = 0xef53
	FSXFS       = 0x58465342
	FSBtrfs     = 0x9123683e
)

// IsRegular reports whether the file is a regular file.
func (s FileStat) IsRegular() bool { return s.Mode&0o170000 == 0o100000 } // S_IFMT, S_IFREG

// Advice is a paging hint for memory (Advise) or a file (AdviseFile).
type Advice int

// Hints. Not every hint applies to both: Advise takes all but
// AdviseNoReuse, AdviseFile all but AdviseHugePage and the populates.
const (
	AdviseNormal Advice = iota
	AdviseSequential
	AdviseRandom
	AdviseWillNeed
	AdviseDontNeed
	// AdviseNoReuse (files): the data is read once.
	AdviseNoReuse
	// AdviseHugePage (memory): back it with transparent huge pages where
	// the kernel allows.
	AdviseHugePage
	// AdvisePopulateRead (memory, Linux 5.14+): fault every page in for
	// reading now, reading the file where it is not in the page cache;
	// ErrUnsupported on older kernels.
	AdvisePopulateRead
	// AdvisePopulateWrite (memory, Linux 5.14+): fault every page in for
	// writing now (allocating it, for shared memory), so that the writes
	// that follow take no faults; ErrUnsupported on older kernels.
	AdvisePopulateWrite
)

func (a Advice) String() string {
	return [...]string{"normal", "sequential", "random", "willneed", "dontneed", "noreuse", "hugepage", "populate-read", "populate-write"}[a]
}
