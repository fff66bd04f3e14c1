#!/usr/bin/env bash
# Apache Kafka from Maven, without Docker: the broker's jars (kafka/pom.xml,
# version pinned there) resolved once into .cache/kafka/<version>/libs, KRaft
# storage formatted, every node a combined broker+controller in one quorum
# (static controller.quorum.voters), each a plain `java -cp 'libs/*'
# kafka.Kafka server.properties` process.
#
#   scripts/kafka.sh run [NODES]     a cluster in the foreground (make kafka): NODES (1 or 3,
#                                    default 1) on loopback ports from KAFKA_PORT (default 19092);
#                                    prints the bootstrap list and where logs go; Ctrl-C stops it
#   scripts/kafka.sh check [NODES]   the same, stopped as soon as it serves metadata (a smoke test)
#   scripts/kafka.sh libs            resolve the jars if missing; print their directory
#   scripts/kafka.sh prepare DIR BROKER_PORT:CONTROLLER_PORT...
#                                    write DIR/node-N/server.properties for one node per port pair
#                                    and format its storage (used by the Go test kit)
#   scripts/kafka.sh node DIR N      exec node N of DIR in the foreground (the JVM replaces this shell)
#
# KAFKA_HEAP (default -Xmx384m) is each node's heap, KAFKA_JVM_OPTS (default
# -XX:TieredStopAtLevel=1) its JIT; KAFKA_CACHE (default
# .cache/kafka under the repository) holds the jars.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pom=$root/kafka/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
cache=${KAFKA_CACHE:-$root/.cache/kafka}
libs=$cache/$version/libs
heap=${KAFKA_HEAP:--Xmx384m}
# C1 only: a node starts with a fraction of the CPU (tests, make kafka); set
# KAFKA_JVM_OPTS= for full JIT (benchmarks).
jvmopts=${KAFKA_JVM_OPTS--XX:TieredStopAtLevel=1}

# libs resolves the jars once: a stamp with the pom's checksum marks a
# complete copy, so a second run needs no network. Concurrent callers (test
# binaries in parallel) wait on one lock.
ensure_libs() {
	local sum
	sum=$(sha256sum "$pom" | cut -d' ' -f1)
	if [ "$(cat "$libs/.complete" 2>/dev/null)" = "$sum" ]; then
		return
	fi
	mkdir -p "$cache"
	exec 9>"$cache/.lock"
	flock 9
	if [ "$(cat "$libs/.complete" 2>/dev/null)" != "$sum" ]; then
		echo "resolving Apache Kafka $version into $libs (once)" >&2
		rm -rf "$libs.tmp"
		mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$libs.tmp" >&2
		rm -rf "$libs"
		mv "$libs.tmp" "$libs"
		echo "$sum" >"$libs/.complete"
	fi
	exec 9>&-
}

# A KRaft cluster ID: 16 random bytes in URL-safe base64, never starting
# with '-' (the storage tool would read it as an option; Kafka's own
# Uuid.randomUuid draws again for the same reason).
cluster_id() {
	local id
	while id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n') && [ "${id#-}" != "$id" ]; do :; done
	printf '%s' "$id"
}

# prepare DIR B:C... writes one node per port pair and formats its storage.
prepare() {
	local dir=$1
	shift
	local n=$# voters="" i=0 pair rf isr
	for pair in "$@"; do
		i=$((i + 1))
		voters+="${voters:+,}$i@127.0.0.1:${pair#*:}"
	done
	rf=$n
	isr=$((n > 1 ? 2 : 1))
	i=0
	for pair in "$@"; do
		i=$((i + 1))
		local node=$dir/node-$i
		mkdir -p "$node/data" "$node/logs"
		cat >"$node/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${pair%%:*},CONTROLLER://127.0.0.1:${pair#*:}
advertised.listeners=PLAINTEXT://127.0.0.1:${pair%%:*}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$node/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
# promptline creates its topics (consumer start, EnsureTopics); nothing else may.
auto.create.topics.enable=false
# A group's first join is not delayed (Kafka's default waits 3s for more members).
group.initial.rebalance.delay.ms=0
EOF
		cat >"$node/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $node/logs/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] node-$i %p %m (%c)%n
appender.out.filter.threshold.type = ThresholdFilter
appender.out.filter.threshold.level = warn
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
EOF
	done
	formatted "$dir" "$n"
	for i in $(seq 1 "$n"); do
		cp -R "$cache/$version/formatted-$n/node-$i/." "$dir/node-$i/data/"
	done
}

# formatted DIR N: KRaft storage for a cluster of N nodes, formatted once
# (a JVM per node) and copied for every cluster after: storage holds no
# port or path, only the cluster's and the node's IDs, and clusters on
# other ports never meet.
formatted() {
	local dir=$1 n=$2 tmpl=$cache/$version/formatted-$n i id
	[ -f "$tmpl/.complete" ] && return
	exec 8>"$cache/.format-lock"
	flock 8
	if [ ! -f "$tmpl/.complete" ]; then
		rm -rf "$tmpl.tmp"
		id=$(cluster_id)
		for i in $(seq 1 "$n"); do
			mkdir -p "$tmpl.tmp/node-$i"
			sed "s|^log.dirs=.*|log.dirs=$tmpl.tmp/node-$i|" "$dir/node-$i/server.properties" >"$tmpl.tmp/server-$i.properties"
			java $heap $jvmopts -cp "$libs/*" -Dlog4j2.configurationFile="$dir/node-$i/log4j2.properties" \
				kafka.tools.StorageTool format -t "$id" -c "$tmpl.tmp/server-$i.properties" >"$dir/node-$i/logs/format.log" 2>&1 ||
				{ cat "$dir/node-$i/logs/format.log" >&2; exit 1; }
			rm "$tmpl.tmp/server-$i.properties"
		done
		rm -rf "$tmpl"
		mv "$tmpl.tmp" "$tmpl"
		touch "$tmpl/.complete"
	fi
	exec 8>&-
}

# node DIR N runs node N in the foreground; exec, so that a signal to this
# process reaches the JVM itself.
node() {
	local node=$1/node-$2
	exec java $heap $jvmopts -Xss1m -XX:+UseSerialGC -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$node/log4j2.properties" -Dkafka.logs.dir="$node/logs" \
		-cp "$libs/*" kafka.Kafka "$node/server.properties"
}

free_port() {
	local p=$1
	while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
	echo "$p"
}

# ready N DIR: every node logged its start and, when kcat is there, the
# metadata names all N brokers.
ready() {
	local n=$1 dir=$2 bootstrap=$3 i
	for i in $(seq 1 "$n"); do
		grep -q 'Kafka Server started' "$dir/node-$i/logs/server.log" 2>/dev/null || return 1
	done
	if command -v kcat >/dev/null; then
		kcat -L -b "$bootstrap" -m 5 2>/dev/null | grep -q "^ $n brokers:" || return 1
	fi
}

cluster() {
	local mode=$1 n=${2:-1}
	case $n in 1 | 3) ;; *) echo "NODES is 1 or 3" >&2; exit 2 ;; esac
	ensure_libs
	local dir pairs=() bootstrap="" port=${KAFKA_PORT:-19092} b c i
	pids=() # global: stop runs from the EXIT trap, after this function returned
	dir=$(mktemp -d -t promptline-kafka.XXXXXX)
	for i in $(seq 1 "$n"); do
		b=$(free_port "$port")
		c=$(free_port $((b + 1)))
		port=$((c + 1))
		pairs+=("$b:$c")
		bootstrap+="${bootstrap:+,}127.0.0.1:$b"
	done
	prepare "$dir" "${pairs[@]}"
	# One node after another: a node shuts down in order only while the
	# controllers keep a quorum, so the last of three (alone) gets SIGKILL
	# after its grace.
	stop() {
		trap - INT TERM EXIT
		echo "stopping Apache Kafka"
		local i pid t
		for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
			pid=${pids[$i]}
			kill -TERM "$pid" 2>/dev/null || continue
			for ((t = 0; t < 100; t++)); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
			kill -KILL "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		done
	}
	trap stop EXIT
	trap 'exit 0' INT TERM
	local started=$SECONDS
	for i in $(seq 1 "$n"); do
		"$0" node "$dir" "$i" >"$dir/node-$i/logs/stdout.log" 2>&1 &
		pids+=($!)
	done
	echo "Apache Kafka $version: $n node(s) starting; logs in $dir/node-*/logs"
	until ready "$n" "$dir" "$bootstrap"; do
		for i in "${!pids[@]}"; do
			if ! kill -0 "${pids[$i]}" 2>/dev/null; then
				echo "node $((i + 1)) exited:" >&2
				tail -n 30 "$dir/node-$((i + 1))/logs/stdout.log" >&2
				exit 1
			fi
		done
		if [ $((SECONDS - started)) -gt 120 ]; then
			echo "Apache Kafka did not serve metadata in 120s (logs in $dir)" >&2
			exit 1
		fi
		sleep 0.2
	done
	echo "Apache Kafka serving metadata after $((SECONDS - started))s: --brokers $bootstrap"
	if [ "$mode" = run ]; then
		echo "try: bin/consumer --brokers $bootstrap   (Ctrl-C stops Kafka)"
		wait "${pids[@]}" || true
	fi
}

cmd=${1:-run}
shift || true
case $cmd in
libs) ensure_libs && echo "$libs" ;;
prepare) ensure_libs && prepare "$@" ;;
node) node "$@" ;;
run | check) cluster "$cmd" "$@" ;;
*) sed -n '2,22p' "$0" >&2; exit 2 ;;
esac
