# need <command> <debian package>: the command, installed from its Debian
# package when this runs as root with apt-get, or a failure naming it.
# Sourced by prereqs.sh and brokerjars.sh's runners.
need() { # need <command> <debian package>
	command -v "$1" >/dev/null 2>&1 && return 0
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "prereqs: installing $2 (for $1)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null ||
			{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null; }
	fi
	command -v "$1" >/dev/null 2>&1 || { echo "prereqs: missing $1: install the Debian package $2" >&2; exit 1; }
}
