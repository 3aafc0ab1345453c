#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft combined mode) for the demo, the tests and CI.
#   kafka.sh fetch   collect the broker jars from Maven Central (pom.xml beside this script)
#   kafka.sh start   fetch if needed, format storage once, start on 127.0.0.1; no-op if already up
#   kafka.sh stop    stop the broker started here (by pid)
#   kafka.sh status  exit 0 if the broker answers on its port
# Environment: FLEETWATCH_HOME (default <repo>/.fleetwatch), KAFKA_PORT (19092),
#              KAFKA_CONTROLLER_PORT (19093), KAFKA_HEAP (512m);
#              KAFKA_SASL_PORT + KAFKA_SASL_PASSWORD: also a SASL_PLAINTEXT listener (mechanism PLAIN,
#              user "fleetwatch") on that port, for the tests of clients that authenticate.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
home="${FLEETWATCH_HOME:-$repo/.fleetwatch}"
port="${KAFKA_PORT:-19092}"
cport="${KAFKA_CONTROLLER_PORT:-19093}"
heap="${KAFKA_HEAP:-512m}"
sasl_port="${KAFKA_SASL_PORT:-}"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
lib="$home/kafka-lib-$kafka_version"
data="$home/kafka-$port"
pidfile="$data/kafka.pid"
props="$data/server.properties"

log() { echo "kafka.sh: $*" >&2; }
# shellcheck source=../lib.sh
source "$here/../lib.sh"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running_pid() { svc_running_pid "$pidfile" kafka.Kafka; }

fetch() {
  if [[ -f "$lib/.complete" ]]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn not found (apt-get install maven)"; exit 1; }
  log "collecting Kafka $kafka_version jars from Maven Central into $lib"
  rm -rf "$lib.tmp"; mkdir -p "$lib.tmp"
  mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$lib.tmp"
  touch "$lib.tmp/.complete"
  rm -rf "$lib"; mv "$lib.tmp" "$lib"
}

write_props() {
  mkdir -p "$data/logs"
  local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
  local advertised="PLAINTEXT://127.0.0.1:$port"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [[ -n "$sasl_port" ]]; then
    [[ -n "${KAFKA_SASL_PASSWORD:-}" ]] || { log "KAFKA_SASL_PORT needs KAFKA_SASL_PASSWORD"; exit 2; }
    listeners+=",SASL_PLAINTEXT://127.0.0.1:$sasl_port"
    advertised+=",SASL_PLAINTEXT://127.0.0.1:$sasl_port"
    protocols+=",SASL_PLAINTEXT:SASL_PLAINTEXT"
  fi
  cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
log.dirs=$data/logs
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.segment.bytes=67108864
PROPS
  if [[ -n "$sasl_port" ]]; then
    local pw="$KAFKA_SASL_PASSWORD"
    cat >> "$props" <<PROPS
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="fleetwatch" password="$pw" user_fleetwatch="$pw";
PROPS
    chmod 600 "$props"  # it holds the password
  fi
}

start() {
  if pid="$(running_pid)" && port_open "$port"; then
    log "already running (pid $pid) on 127.0.0.1:$port"; return 0
  fi
  if port_open "$port"; then
    log "port $port is taken by another process; reusing the broker there"; return 0
  fi
  fetch
  command -v java >/dev/null || { log "java not found (apt-get install default-jre-headless)"; exit 1; }
  write_props
  local cp="$lib/*"
  if [[ ! -f "$data/logs/meta.properties" ]]; then
    local cid; cid="$(java -cp "$cp" kafka.tools.StorageTool random-uuid)"
    java -cp "$cp" kafka.tools.StorageTool format --standalone -t "$cid" -c "$props" >/dev/null
  fi
  log "starting Kafka $kafka_version on 127.0.0.1:$port (data in $data)"
  # setsid: the broker outlives the shell that started it (the demo and CI reuse it).
  setsid java -Xmx"$heap" -Xms128m -XX:+UseG1GC \
      -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.file="$data/server.log" \
      -cp "$cp" kafka.Kafka "$props" >"$data/stdout.log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
  svc_wait_ready kafka "$pidfile" "$data/stdout.log" 60 port_open "$port"
}

stop() { svc_stop kafka "$pidfile" kafka.Kafka 30; }

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) port_open "$port" ;;
  *) echo "usage: $0 fetch|start|stop|status" >&2; exit 2 ;;
esac
