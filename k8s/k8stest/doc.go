// Package k8stest starts a real Kubernetes control plane for tests: etcd
// and kube-apiserver, and on request kube-controller-manager,
// kube-scheduler and kwok, each a process on free loopback ports, with a
// test certificate authority, client certificates and RBAC as a real
// cluster has them. [Start] returns a [Cluster] whose
// [Cluster.RESTConfig] is an administrator's (group system:masters) and
// whose [Cluster.UserConfig] gives any other user and groups, for RBAC
// tests. With kwok, [Cluster.AddNodes] turns a super node topology
// (ub/topology) into simulated Nodes, labelled and sized from it, that
// kwok keeps Ready and whose pods it runs; [Cluster.CrashNode] and
// [Cluster.RecoverNode] take one down and bring it back.
//
// It runs the real binaries, built from the Kubernetes, etcd and kwok Go
// modules of the versions in [KubernetesVersion], [EtcdVersion] and
// [KwokVersion]. ubkit's `make prereqs` builds them into [DefaultBinDir];
// a missing one fails the test, naming it. Everything Start makes is
// stopped and removed by the test's cleanup, and the processes die with
// the test process if it is killed. Each process's log stays in the
// test's temporary directory while the test runs, and its tail is printed
// when the process fails to start.
//
// Programs that are not tests (a demo, a benchmark) use
// [StartControlPlane] instead, and stop the cluster with [Cluster.Close].
//
// It is for tests, not for running clusters: there are no kubelets, no
// containers and no network; pods on kwok's nodes only look Running. The
// processes use Linux's parent-death signal; elsewhere they compile but a
// killed test may leave them running.
package k8stest
