package mesh

import (
	"context"
	"strings"
	"testing"
)

// TestParseRegistryErrors: a registry file with a mistake is refused with
// the mistake named, rather than half-read.
func TestParseRegistryErrors(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"services:\n  - name: web\n    endpoints:\n      - {node: n1, addr: \"10.0.0.1:80\"}\n", "field addr not found"},
		{"services:\n  - name: web\n    endpoints:\n      - {node: n1, address: \"10.0.0.1\"}\n", "is not host:port"},
		{"services:\n  - name: web\n    endpoints:\n      - {node: n1, address: \"10.0.0.1:0\"}\n", "bad port"},
		{"services:\n  - name: web\n    endpoints:\n      - {address: \"10.0.0.1:80\"}\n", "node \"\""},
		{"services:\n  - name: \"my web\"\n", "spaces or control characters"},
		{"services:\n  - name: web\n  - name: web\n", "empty or repeated"},
		{"services:\n  - name: web\n    proxy_port: 70000\n", "proxy port 70000"},
		{"services:\n  - name: web\n    endpoints:\n      - {node: n1, address: \"10.0.0.1:80\", bus: \"tcp://n1/web\"}\n", "does not start with ub://"},
		{"services: [", "yaml"},
		{"servics: []\n", "field servics not found"},
	} {
		_, err := parseRegistry([]byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error with %q", c.file, err, c.want)
		}
	}
	r, err := parseRegistry([]byte("services:\n  - name: web\n    proxy_port: 8080\n    endpoints:\n      - {node: n1, address: \"10.0.0.1:80\", bus: \"ub://n1/web\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := r.Services(context.Background()); len(s) != 1 || s[0].Instances[0].Bus != "ub://n1/web" || s[0].ProxyPort != 8080 {
		t.Errorf("read %+v", s)
	}
	if r, err := parseRegistry(nil); err != nil {
		t.Errorf("an empty file: %v", err)
	} else if s, _ := r.Services(context.Background()); len(s) != 0 {
		t.Errorf("an empty file has services: %+v", s)
	}
}

// FuzzParseRegistry: any file is read or refused without a crash, and what
// is read passes the registry's own checks again.
func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte("services:\n  - name: web\n    endpoints:\n      - {node: n1, address: \"10.0.0.1:80\", bus: \"ub://n1/web\"}\n"))
	f.Add([]byte("services: [{name: a, proxy_port: 1}]"))
	f.Add([]byte("{\"services\": [{\"name\": \"x\", \"endpoints\": [{\"node\": \"n\", \"address\": \"[::1]:9\"}]}]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRegistry(b)
		if err != nil {
			return
		}
		s, _ := r.Services(context.Background())
		if err := r.Set(s); err != nil {
			t.Fatalf("read services that the registry then refuses: %v", err)
		}
	})
}
