#!/usr/bin/env bash
# Builds, when missing, the binaries of the real Kubernetes control plane
# that k8s/k8stest starts: kube-apiserver, kube-controller-manager and
# kube-scheduler from the k8s.io/kubernetes module, etcd from
# go.etcd.io/etcd/server/v3, kwok and its stage files from sigs.k8s.io/kwok.
# Only the Go module proxy is used (shared/K8S.md has the recipe).
# k8stest.Build runs this script (embedded in the package) with the
# versions of its constants; `make prereqs` and `ubctl demo k8s` call Build.
#
# They go into a user-level cache, not the clone's .cache, so a fresh clone
# (CI) does not rebuild Kubernetes: $UBKIT_K8S_BIN (Build sets it), holds
#   kubernetes-<version>/{kube-apiserver,kube-controller-manager,kube-scheduler}
#   etcd-<version>/etcd
#   kwok-<version>/kwok and kwok-<version>/stages/*.yaml
# k8s/k8stest looks in the same place (k8stest.DefaultBinDir). Each directory
# is built in a temporary directory beside it and renamed into place only
# when complete, so an interrupted build leaves nothing half-made.
set -euo pipefail

# The versions come from k8stest's constants (bin.go), through Build.
k8s_version=${K8STEST_KUBERNETES_VERSION:?set by k8stest.Build}
etcd_version=${K8STEST_ETCD_VERSION:?set by k8stest.Build}
kwok_version=${K8STEST_KWOK_VERSION:?set by k8stest.Build}
# The staging modules (client-go and the rest) are released as v0.<minor>.<patch>.
k8s_staging_version=v0.${k8s_version#v1.}

root=${UBKIT_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/ubkit/k8s}
mkdir -p "$root"

# Two shared cores: build at low priority and at most two packages at once.
export GOFLAGS="${GOFLAGS:-} -p=2"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0
nice=(nice -n 10)

# Temporary build directories, removed however the script ends: those of
# every set this run holds the lock of (nobody else builds them), so that
# a signal between a mktemp and its tmps+= leaves nothing behind either.
tmps=()
locked=()
cleanup() {
	local d s
	for d in "${tmps[@]}"; do rm -rf "$d"; done
	for s in "${locked[@]}"; do rm -rf "$root/.$s-build."*; done
}
trap cleanup EXIT

# newmod <dir>: an empty throwaway module in dir.
newmod() {
	mkdir -p "$1"
	(cd "$1" && go mod init ubkit.invalid/k8sbin >/dev/null 2>&1)
}

# lock <set>: waits until no other run builds that set, and holds it
# until this script ends; then removes what builds of it left behind (an
# interrupted run's temporary directories: none can be in use now).
lock() {
	local fd
	exec {fd}>"$root/.$1.lock"
	flock "$fd"
	locked+=("$1")
	rm -rf "$root/.$1-build."*
}

# finish <tmp> <dest>: moves a completed build into place.
finish() {
	rm -rf "$2" # a broken earlier build: mv would nest inside it
	mv "$1" "$2"
}

build_etcd() {
	local dest="$root/etcd-$etcd_version"
	[ -x "$dest/etcd" ] && return 0
	lock etcd
	[ -x "$dest/etcd" ] && return 0 # another run built it meanwhile
	echo "k8stest: building etcd $etcd_version into $dest (about 1 minute)"
	local tmp
	tmp=$(mktemp -d "$root/.etcd-build.XXXXXX")
	tmps+=("$tmp")
	newmod "$tmp/mod"
	(cd "$tmp/mod" &&
		go get "go.etcd.io/etcd/server/v3@$etcd_version" &&
		"${nice[@]}" go build -trimpath -ldflags "-s -w" -o "$tmp/out/etcd" go.etcd.io/etcd/server/v3) ||
		{ echo "k8stest: could not build etcd $etcd_version" >&2; return 1; }
	[ -x "$tmp/out/etcd" ] || { echo "k8stest: the build of etcd $etcd_version made no etcd" >&2; return 1; }
	finish "$tmp/out" "$dest"
	rm -rf "$tmp"
}

build_kwok() {
	local dest="$root/kwok-$kwok_version"
	# kwok's standard stages for nodes and pods, and its chaos stage
	# that makes a labelled node NotReady (k8stest's CrashNode).
	local stages=(node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease node/chaos/node-not-ready
		pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete) stage
	complete() {
		[ -x "$dest/kwok" ] || return 1
		for stage in "${stages[@]}"; do [ -f "$dest/stages/${stage##*/}.yaml" ] || return 1; done
	}
	complete && return 0
	lock kwok
	complete && return 0 # another run built it meanwhile
	echo "k8stest: building kwok $kwok_version into $dest (about 2 minutes)"
	local tmp
	tmp=$(mktemp -d "$root/.kwok-build.XXXXXX")
	tmps+=("$tmp")
	newmod "$tmp/mod"
	(cd "$tmp/mod" &&
		go get "sigs.k8s.io/kwok/cmd/kwok@$kwok_version" &&
		"${nice[@]}" go build -trimpath -ldflags "-s -w" -o "$tmp/out/kwok" sigs.k8s.io/kwok/cmd/kwok) ||
		{ echo "k8stest: could not build kwok $kwok_version" >&2; return 1; }
	# kwok exits with "no stages found" unless given stages; the module ships
	# them under kustomize/stage/ (the pods' fast ones need no pod-create
	# stage, unlike those in general/).
	local src
	src=$(cd "$tmp/mod" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
	mkdir -p "$tmp/out/stages"
	for stage in "${stages[@]}"; do
		cp "$src/kustomize/stage/$stage.yaml" "$tmp/out/stages/" ||
			{ echo "k8stest: kwok $kwok_version has no stage $stage.yaml under $src/kustomize/stage" >&2; return 1; }
	done
	chmod -R u+w "$tmp/out/stages"
	[ -x "$tmp/out/kwok" ] || { echo "k8stest: the build of kwok $kwok_version made no kwok" >&2; return 1; }
	finish "$tmp/out" "$dest"
	rm -rf "$tmp"
}

build_kubernetes() {
	local dest="$root/kubernetes-$k8s_version"
	local cmds=(kube-apiserver kube-controller-manager kube-scheduler) c
	complete() {
		for c in "${cmds[@]}"; do [ -x "$dest/$c" ] || return 1; done
	}
	complete && return 0
	lock kubernetes
	complete && return 0 # another run built it meanwhile
	echo "k8stest: building Kubernetes $k8s_version (${cmds[*]}) into $dest: the first build takes about 15 minutes"
	local tmp
	tmp=$(mktemp -d "$root/.kubernetes-build.XXXXXX")
	tmps+=("$tmp")
	newmod "$tmp/mod"
	# set -e does not hold inside a subshell that is the left side of ||:
	# every command says what happens when it fails.
	(
		cd "$tmp/mod" || exit 1
		gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p') || exit 1
		[ -f "$gomod" ] || { echo "k8stest: no go.mod for k8s.io/kubernetes@$k8s_version" >&2; exit 1; }
		# k8s.io/kubernetes replaces its staging modules with ./staging/...;
		# replaces in a dependency are ignored, so replace each with its
		# published release here.
		staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod") || exit 1
		[ -n "$staging" ] || { echo "k8stest: no staging modules found in $gomod" >&2; exit 1; }
		for m in $staging; do go mod edit -replace="$m=$m@$k8s_staging_version" || exit 1; done
		for c in "${cmds[@]}"; do go get "k8s.io/kubernetes/cmd/$c@$k8s_version" || exit 1; done
		minor=${k8s_version#v1.}
		minor=${minor%%.*}
		ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
		for c in "${cmds[@]}"; do
			echo "k8stest: building $c $k8s_version"
			"${nice[@]}" go build -trimpath -ldflags "$ldflags" -o "$tmp/out/$c" "k8s.io/kubernetes/cmd/$c" || exit 1
		done
	) || { echo "k8stest: could not build Kubernetes $k8s_version" >&2; return 1; }
	for c in "${cmds[@]}"; do
		[ -x "$tmp/out/$c" ] || { echo "k8stest: the build of Kubernetes $k8s_version made no $c" >&2; return 1; }
	done
	finish "$tmp/out" "$dest"
	rm -rf "$tmp"
}

# build.sh [etcd|kwok|kubernetes]...: those only (all by default). Runs
# at once build different sets at once, and the same set one at a time.
command -v flock >/dev/null || { echo "k8stest: building needs flock (Debian's util-linux)" >&2; exit 1; }
for what in ${@:-etcd kwok kubernetes}; do
	case $what in
	etcd | kwok | kubernetes) "build_$what" ;;
	*) echo "k8stest: unknown binaries $what (want etcd, kwok or kubernetes)" >&2; exit 2 ;;
	esac
done
echo "k8stest: Kubernetes test binaries ok ($root)"
