# Sourced by prereqs.sh, and run by internal/testenv.ResolveBrokerJars
# (ubctl demo mq) after need.sh, with $cache set.
# Real message brokers for the mq tests: Pulsar standalone and a RocketMQ
# name server and broker (internal/testenv StartPulsar, StartRocketMQ), run
# from their Maven Central jars with Java 17. Maven resolves them once per
# version, through a throwaway pom, into $cache/<broker>-<version>/lib. Its
# local repository is the user's ($UBKIT_M2, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ubkit/m2), not the clone's, so that a
# fresh clone (CI's) copies the jars in seconds instead of downloading
# 450 MB again. A lib directory is only ever renamed into place complete,
# so one that exists is complete.
m2=${UBKIT_M2:-${XDG_CACHE_HOME:-$HOME/.cache}/ubkit/m2}
pulsar_version=4.0.7     # and PulsarVersion in brokers.go
rocketmq_version=5.5.0   # and RocketMQVersion in brokers.go
need java openjdk-17-jre-headless
java_major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
[ "${java_major:-0}" -ge 17 ] 2>/dev/null ||
	{ echo "prereqs: java is version ${java_major:-unknown}; the brokers need Java 17 or later (Debian package openjdk-17-jre-headless)" >&2; exit 1; }
resolve_jars() { # resolve_jars <name> <version> <marker jar> <pom dependencies>
	local lib="$cache/$1-$2/lib"
	[ -f "$lib/$3" ] && return 0
	need mvn maven
	echo "prereqs: resolving $1 $2 from Maven Central into $lib (minutes on a cold cache)"
	local tmp
	tmp=$(mktemp -d "$cache/$1-$2.tmp.XXXXXX")
	cat > "$tmp/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.ubkit.prereqs</groupId>
  <artifactId>$1-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
$4
</project>
POM
	if ! mvn -B -q -f "$tmp/pom.xml" -Dmaven.repo.local="$m2" \
		dependency:copy-dependencies -DoutputDirectory="$tmp/lib" -DincludeScope=runtime >"$tmp/mvn.log" 2>&1; then
		# Debian's mvn writes colour resets even when quiet: strip them.
		sed 's/\x1b\[[0-9;]*m//g' "$tmp/mvn.log" >&2
		rm -rf "$tmp"
		echo "prereqs: could not resolve $1 $2 with mvn (is Maven Central reachable?)" >&2
		exit 1
	fi
	[ -f "$tmp/lib/$3" ] || { rm -rf "$tmp"; echo "prereqs: mvn resolved $1 $2 without $3" >&2; exit 1; }
	rm -rf "$lib" # a broken earlier copy: mv would nest inside it
	mkdir -p "$(dirname "$lib")"
	mv "$tmp/lib" "$lib"
	rm -rf "$tmp"
	echo "prereqs: $1 $2: $(ls "$lib" | wc -l) jars, $(du -sh "$lib" | cut -f1)"
}
# Pulsar's own BOM pins the transitive versions it ships with; without it
# Maven picks others.
resolve_jars pulsar "$pulsar_version" "pulsar-broker-$pulsar_version.jar" "  <dependencyManagement><dependencies>
    <dependency><groupId>org.apache.pulsar</groupId><artifactId>pulsar</artifactId><version>$pulsar_version</version><type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>org.apache.pulsar</groupId><artifactId>pulsar-broker</artifactId><version>$pulsar_version</version></dependency>
  </dependencies>"
resolve_jars rocketmq "$rocketmq_version" "rocketmq-broker-$rocketmq_version.jar" "  <dependencies>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-namesrv</artifactId><version>$rocketmq_version</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-broker</artifactId><version>$rocketmq_version</version></dependency>
  </dependencies>"
