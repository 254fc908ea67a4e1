package k8stest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A port taken between its choice and etcd's bind, by a server that
// passes for etcd's health check, makes the start try again on other
// ports: the cluster that starts runs on its own etcd, not the impostor.
func TestStartPortTaken(t *testing.T) {
	impostor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			fmt.Fprint(w, `{"health":"true"}`)
			return
		}
		http.NotFound(w, r)
	}))
	defer impostor.Close()
	taken := impostor.Listener.Addr().(*net.TCPAddr).Port
	tries := 0
	choosePorts = func(n int) ([]int, error) {
		tries++
		ports, err := freePorts(n)
		if err == nil && tries == 1 {
			ports[0] = taken // etcd's client port
		}
		return ports, err
	}
	defer func() { choosePorts = freePorts }()
	c, err := StartControlPlane(t.Context(), Config{})
	if err != nil {
		t.Fatalf("the start after a taken port: %v", err)
	}
	defer c.Close()
	if tries != 2 {
		t.Errorf("%d tries, want 2", tries)
	}
	if _, err := c.Client().CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Errorf("the cluster does not answer: %v", err)
	}
}
