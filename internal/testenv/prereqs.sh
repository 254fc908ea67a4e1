#!/usr/bin/env bash
# Installs or builds what `make test` needs and is missing. Everything that is
# downloaded is cached under $UBKIT_CACHE. A prerequisite that cannot be had
# fails here with its name.
set -euo pipefail

cache=${UBKIT_CACHE:-$(pwd)/.cache}
mkdir -p "$cache"

here=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=need.sh
source "$here/need.sh"

need go golang-go
# Real servers for the cache tests and the benchmarks' baselines (started
# by internal/testenv on free loopback ports). Installing them must not
# start the system's own copies.
need_server() { # need_server <command> <debian package>
	command -v "$1" >/dev/null 2>&1 && return 0
	local policy=""
	if [ "$(id -u)" = 0 ] && [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1
	fi
	need "$1" "$2"
	[ -n "$policy" ] && rm -f /usr/sbin/policy-rc.d
	return 0
}
need_server redis-server redis-server
# redis-cli joins the Redis Cluster of the cluster tests (testenv
# StartRedisCluster: redis-cli --cluster create).
need redis-cli redis-tools
need_server memcached memcached
# HAProxy is the mesh benchmark's baseline: two instances relaying between
# the nodes with mutual TLS (internal/bench/meshsuite starts them).
need_server haproxy haproxy
# pymemcache, an independent memcached client, drives the memcached
# server's differential test (cache/memcached, against memcached 1.6). It
# is installed once per version into the cache; internal/testenv
# (Pymemcache) finds it there.
pymemcache_version=4.0.0 # and PymemcacheVersion in pymemcache.go
pymemcache_dir="$cache/python/pymemcache-$pymemcache_version"
if [ ! -f "$pymemcache_dir/pymemcache/__init__.py" ]; then
	need python3 python3
	python3 -m pip --version >/dev/null 2>&1 || need pip3 python3-pip
	python3 -m pip --version >/dev/null 2>&1 ||
		{ echo "prereqs: missing pip for python3 (Debian package python3-pip), needed to install pymemcache" >&2; exit 1; }
	echo "prereqs: installing pymemcache $pymemcache_version into $pymemcache_dir"
	rm -rf "$pymemcache_dir.tmp"
	# --target touches no system packages, so a Debian python3 marked
	# externally managed may install there.
	PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check --no-deps --target "$pymemcache_dir.tmp" "pymemcache==$pymemcache_version" ||
		{ echo "prereqs: could not install pymemcache $pymemcache_version with python3 -m pip" >&2; rm -rf "$pymemcache_dir.tmp"; exit 1; }
	rm -rf "$pymemcache_dir" # a broken earlier install: mv would nest inside it
	mv "$pymemcache_dir.tmp" "$pymemcache_dir"
fi
# Python's safetensors (with numpy) writes the model files that the fs
# package's safetensors tests read back tensor by tensor, and is the
# baseline of its benchmark. Installed once per version into the cache;
# internal/testenv (Safetensors) finds it there.
safetensors_version=0.6.2 # and SafetensorsVersion in safetensors.go
numpy_version=2.2.6       # and NumpyVersion there
safetensors_dir="$cache/python/safetensors-$safetensors_version-numpy-$numpy_version"
if [ ! -f "$safetensors_dir/safetensors/__init__.py" ] || [ ! -f "$safetensors_dir/numpy/__init__.py" ]; then
	need python3 python3
	python3 -m pip --version >/dev/null 2>&1 || need pip3 python3-pip
	python3 -m pip --version >/dev/null 2>&1 ||
		{ echo "prereqs: missing pip for python3 (Debian package python3-pip), needed to install safetensors" >&2; exit 1; }
	echo "prereqs: installing safetensors $safetensors_version and numpy $numpy_version into $safetensors_dir"
	rm -rf "$safetensors_dir.tmp"
	PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --target "$safetensors_dir.tmp" "safetensors==$safetensors_version" "numpy==$numpy_version" ||
		{ echo "prereqs: could not install safetensors $safetensors_version and numpy $numpy_version with python3 -m pip" >&2; rm -rf "$safetensors_dir.tmp"; exit 1; }
	rm -rf "$safetensors_dir"
	mv "$safetensors_dir.tmp" "$safetensors_dir"
fi
# Real message brokers for the mq tests (brokerjars.sh, which ubctl demo mq
# runs too).
# shellcheck source=brokerjars.sh
source "$here/brokerjars.sh"
# Network namespace tests (internal/testenv NewNetnsPair) need root and `ip`.
# Without root they fail, saying so; there is nothing to install for them.
if [ "$(id -u)" = 0 ]; then
	# The Go side also looks in the sbin directories, which a minimal $PATH
	# may lack.
	[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need ip iproute2
	# Tests of what another user can do (internal/testenv OtherUser) make
	# throwaway users with useradd and userdel.
	[ -x /usr/sbin/useradd ] || [ -x /sbin/useradd ] || need useradd passwd
else
	echo "prereqs: not root: the network namespace tests will fail (they need root and the ip command, Debian package iproute2)" >&2
fi
[ -d /dev/shm ] && [ -w /dev/shm ] || { echo "prereqs: /dev/shm must exist and be writable (mount a tmpfs there)" >&2; exit 1; }
[ -r /proc/self/stat ] || { echo "prereqs: /proc must be mounted" >&2; exit 1; }

# Reserve huge pages for the huge-page segment tests (shm TestHugePages
# maps a memfd of 3 pages of 2 MiB; test runs at the same time each take
# theirs). Without them those tests fail, naming this prerequisite.
huge_want=16
huge_have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
if [ "$huge_have" -lt "$huge_want" ] && [ "$(id -u)" = 0 ]; then
	echo "$huge_want" > /proc/sys/vm/nr_hugepages 2>/dev/null || true
	huge_have=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
fi
if [ "$huge_have" -lt 3 ]; then
	echo "prereqs: only $huge_have huge pages reserved (/proc/sys/vm/nr_hugepages), and the huge-page tests need 3 of 2 MiB:" \
		"as root, run echo $huge_want > /proc/sys/vm/nr_hugepages (make prereqs does; a kernel without huge pages cannot run them)" >&2
	exit 1
fi

# Module downloads are cached by the go command; fetch them once up front so a
# network problem shows here, named, rather than inside a test.
go mod download
# The shmipc-go benchmark baseline is a nested module (so ubkit's users do not
# inherit its dependencies); its test builds it.
(cd bench/shmipc && go mod download)
# The real control plane of k8s/k8stest (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok), built from their Go
# modules when missing. They live in a user-level cache
# (${UBKIT_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/ubkit/k8s}), not in
# $cache, so that a fresh clone (CI's) reuses them: the first build takes
# about 15 minutes.
go run ./internal/testenv/k8sbin
echo "prereqs: ok (cache $cache)"
