package transport

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// sendFiles passes open files to the other end of uc (SCM_RIGHTS).
func sendFiles(uc *net.UnixConn, files ...*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err := uc.WriteMsgUnix([]byte{'F'}, syscall.UnixRights(fds...), nil)
	return err
}

// receiveFiles receives exactly n files sent with sendFiles.
func receiveFiles(uc *net.UnixConn, n int) ([]*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, syscall.CmsgSpace(4*n))
	got, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if f, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	if got != 1 || buf[0] != 'F' || len(fds) != n || flags&syscall.MSG_CTRUNC != 0 {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, fmt.Errorf("transport: expected %d descriptors, got %d", n, len(fds))
	}
	files := make([]*os.File, n)
	for i, fd := range fds {
		syscall.CloseOnExec(fd)
		// Non-blocking, so reads park in Go's netpoller.
		syscall.SetNonblock(fd, true)
		files[i] = os.NewFile(uintptr(fd), "ubkit-notify")
	}
	return files, nil
}
