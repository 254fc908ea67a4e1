package shm

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// SendSegment passes a memfd segment to the process at the other end of conn
// (SCM_RIGHTS). The receiver maps it with ReceiveSegment. Seal the segment
// first if the receiver requires it.
func SendSegment(conn *net.UnixConn, s *Segment) error {
	if s.file != "" {
		return errors.New("shm: SendSegment takes a memfd segment; open named segments by name")
	}
	rights := unix.UnixRights(s.fd)
	_, _, err := conn.WriteMsgUnix([]byte{'S'}, rights, nil)
	if err != nil {
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
}

// ReceiveSegment receives a segment sent with SendSegment and maps it after
// validating its header.
func ReceiveSegment(conn *net.UnixConn, opts *ReceiveOptions) (*Segment, error) {
	if opts == nil {
		opts = &ReceiveOptions{}
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("shm: receive segment: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("shm: receive segment: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err == nil {
			fds = append(fds, got...)
		}
	}
	closeAll := func(fds []int) {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if n != 1 || buf[0] != 'S' || len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
		closeAll(fds)
		return nil, fmt.Errorf("shm: receive segment: expected one descriptor, got %d (message %q)", len(fds), buf[:n])
	}
	fd := fds[0]
	unix.CloseOnExec(fd)
	if !opts.AllowUnsealed {
		seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
			unix.Close(fd)
			return nil, errors.New("shm: received segment is not sealed against shrinking; the sender must call Seal")
		}
	}
	return mapExisting(fd)
}
