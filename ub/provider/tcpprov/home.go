package tcpprov

import (
	"fmt"
	"net"
	"strings"
)

// Home is the host that holds the object a descriptor's Name names: the
// host of the address of the context that made it. A transport that
// learns descriptors from a peer on another host checks that they are the
// peer's own (the host it speaks from), so that no peer has this context
// write into a third party's memory on its behalf.
func (c *Context) Home(name string) (string, error) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", fmt.Errorf("tcpprov: %q is not a descriptor name", name)
	}
	host, _, err := net.SplitHostPort(name[:i])
	if err != nil {
		return "", fmt.Errorf("tcpprov: %q: %w", name, err)
	}
	return host, nil
}
