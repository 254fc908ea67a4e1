//go:build linux

package shm

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// SendSegment passes a memfd segment to the process at the other end of conn
// (SCM_RIGHTS). The receiver maps it with ReceiveSegment. Seal the segment
// first if the receiver requires it.
func SendSegment(conn *net.UnixConn, s *Segment) error {
	if s.file != "" {
		return errors.New("shm: SendSegment takes a memfd segment; open named segments by name")
	}
	if err := sendRights(conn, 'S', s.fd); err != nil {
		return fmt.Errorf("shm: send segment: %w", err)
	}
	return nil
}

// ReceiveOptions says what ReceiveSegment accepts. The zero value is the
// safe default.
type ReceiveOptions struct {
	// AllowUnsealed accepts segments whose size is not sealed. A sender that
	// can shrink a segment after we mapped it can make our next access fault
	// (SIGBUS), which no error check can catch: allow it only for trusted
	// senders.
	AllowUnsealed bool
	// Size, when not zero, is the only size accepted: the size the sender
	// passed to CreateMemfd (without huge pages). A segment of another size
	// is refused before it is mapped.
	Size int
}

// ReceiveSegment receives a segment sent with SendSegment and maps it after
// checking the descriptor and validating the segment's header. The
// descriptor must be a memfd open for reading and writing, sealed against
// shrinking and growing (unless opts.AllowUnsealed) but not against
// writing, of opts.Size if set; anything else is refused with an error
// wrapping ErrBadDescriptor, every descriptor received closed.
func ReceiveSegment(conn *net.UnixConn, opts *ReceiveOptions) (*Segment, error) {
	if opts == nil {
		opts = &ReceiveOptions{}
	}
	fds, err := receiveRights(conn, 'S', 1)
	if err != nil {
		return nil, fmt.Errorf("shm: receive segment: %w", err)
	}
	fd := fds[0]
	if err := checkMemfd(fd, opts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: receive segment: %w", err)
	}
	return mapExisting(fd)
}

// checkMemfd says whether fd is a segment ReceiveSegment may map.
func checkMemfd(fd int, opts *ReceiveOptions) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: a %s where a memfd belongs", ErrBadDescriptor, fileKind(st.Mode))
	}
	if mode, err := accessMode(fd); err != nil || mode != unix.O_RDWR {
		return fmt.Errorf("%w: the memfd is not open for reading and writing", ErrBadDescriptor)
	}
	// Only memfds (and files of shared-memory file systems, which are
	// sealed against sealing itself from birth) have seals.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if !opts.AllowUnsealed {
		const size = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
		if err != nil || seals&size != size {
			return fmt.Errorf("%w: the segment is not sealed against shrinking and growing; the sender must call Seal", ErrBadDescriptor)
		}
	}
	if err == nil && seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		return fmt.Errorf("%w: the segment is sealed against writing and cannot be shared", ErrBadDescriptor)
	}
	if opts.Size != 0 {
		if want := int64(pageAlign(HeaderSize + opts.Size)); st.Size != want {
			return fmt.Errorf("%w: a segment of %d bytes, expected %d", ErrBadDescriptor, st.Size, want)
		}
	}
	return nil
}

// PipeEnd is the end of a pipe ReceivePipes expects.
type PipeEnd int

// The ends of a pipe.
const (
	PipeReadEnd PipeEnd = iota + 1
	PipeWriteEnd
)

// accessMode is how the end is open, if it is this end.
func (e PipeEnd) accessMode() int {
	switch e {
	case PipeReadEnd:
		return unix.O_RDONLY
	case PipeWriteEnd:
		return unix.O_WRONLY
	}
	return -1
}

func (e PipeEnd) String() string {
	switch e {
	case PipeReadEnd:
		return "read end"
	case PipeWriteEnd:
		return "write end"
	}
	return fmt.Sprintf("PipeEnd(%d)", int(e))
}

// SendPipes passes pipe ends to the process at the other end of conn
// (SCM_RIGHTS) in one message, for ReceivePipes.
func SendPipes(conn *net.UnixConn, ends ...*os.File) error {
	fds := make([]int, len(ends))
	for i, f := range ends {
		fds[i] = int(f.Fd())
	}
	if err := sendRights(conn, 'F', fds...); err != nil {
		return fmt.Errorf("shm: send pipes: %w", err)
	}
	return nil
}

// ReceivePipes receives the pipe ends sent with SendPipes: exactly
// len(want) descriptors, the i-th a pipe (or FIFO) open only for want[i],
// each of a different pipe. It returns them as non-blocking files, so that
// reads and writes wait in Go's netpoller and deadlines work. Anything else
// (a descriptor of another kind or access mode, both ends of one pipe, more
// or fewer descriptors) is refused with an error wrapping ErrBadDescriptor,
// every descriptor received closed.
func ReceivePipes(conn *net.UnixConn, want ...PipeEnd) ([]*os.File, error) {
	fds, err := receiveRights(conn, 'F', len(want))
	if err != nil {
		return nil, fmt.Errorf("shm: receive pipes: %w", err)
	}
	if err := checkPipes(fds, want); err != nil {
		closeFds(fds)
		return nil, fmt.Errorf("shm: receive pipes: %w", err)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "ubkit-pipe")
	}
	return files, nil
}

// checkPipes says whether fds are the pipe ends want, each of another
// pipe, and makes them non-blocking.
func checkPipes(fds []int, want []PipeEnd) error {
	type inode struct{ dev, ino uint64 }
	seen := make(map[inode]bool, len(fds))
	for i, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return fmt.Errorf("%w: a %s where the %s of a pipe belongs", ErrBadDescriptor, fileKind(st.Mode), want[i])
		}
		mode, err := accessMode(fd)
		if err != nil {
			return err
		}
		if mode != want[i].accessMode() {
			return fmt.Errorf("%w: a pipe open %s where its %s belongs", ErrBadDescriptor, accessModeName(mode), want[i])
		}
		id := inode{st.Dev, st.Ino}
		if seen[id] {
			return fmt.Errorf("%w: two ends of the same pipe", ErrBadDescriptor)
		}
		seen[id] = true
		if err := unix.SetNonblock(fd, true); err != nil {
			return err
		}
	}
	return nil
}

// sendRights sends one byte, tag, carrying fds.
func sendRights(conn *net.UnixConn, tag byte, fds ...int) error {
	_, _, err := conn.WriteMsgUnix([]byte{tag}, unix.UnixRights(fds...), nil)
	return err
}

// receiveRights receives one byte, tag, carrying exactly n descriptors,
// and marks them close-on-exec. Anything else (another byte, fewer or more
// descriptors, a truncated control message, whose descriptors beyond the
// buffer the kernel closes) is refused with an error wrapping
// ErrBadDescriptor, every descriptor received closed.
func receiveRights(conn *net.UnixConn, tag byte, n int) ([]int, error) {
	buf := make([]byte, 1)
	// Room for one more than expected: a sender that passes too many is
	// then refused for that, not for a truncated message.
	oob := make([]byte, unix.CmsgSpace(4*(n+1)))
	got, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		// Not the kernel's layout, so no descriptors can be found in it.
		return nil, fmt.Errorf("%w: malformed control message: %w", ErrBadDescriptor, err)
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	switch {
	case got != 1 || buf[0] != tag:
		closeFds(fds)
		return nil, fmt.Errorf("%w: message %q, expected %q", ErrBadDescriptor, buf[:got], tag)
	case flags&unix.MSG_CTRUNC != 0:
		closeFds(fds)
		return nil, fmt.Errorf("%w: expected %d descriptors, got more than %d", ErrBadDescriptor, n, len(fds))
	case len(fds) != n:
		closeFds(fds)
		return nil, fmt.Errorf("%w: expected %d descriptors, got %d", ErrBadDescriptor, n, len(fds))
	}
	return fds, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// accessMode returns how fd is open: O_RDONLY, O_WRONLY or O_RDWR.
func accessMode(fd int) (int, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	return fl & unix.O_ACCMODE, err
}

func accessModeName(mode int) string {
	switch mode {
	case unix.O_RDONLY:
		return "read-only"
	case unix.O_WRONLY:
		return "write-only"
	}
	return "read-write"
}

// fileKind names the type of file a mode says.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "pipe"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symbolic link"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}
