#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft combined mode) for the demo, the tests and CI.
#   kafka.sh fetch   collect the broker jars from Maven Central (pom.xml beside this script)
#   kafka.sh start   fetch if needed, format storage once, start on 127.0.0.1; no-op if already up
#   kafka.sh stop    stop the broker started here (by pid)
#   kafka.sh fresh   stop it, delete its data (every topic) and start it empty: the test suite's
#                    own brokers, so that a local run starts as CI's clean clone does
#   kafka.sh status  exit 0 if the broker answers on its port
# Environment: FLEETWATCH_HOME (default <repo>/.fleetwatch), KAFKA_PORT (19092),
#              KAFKA_CONTROLLER_PORT (19093), KAFKA_HEAP (512m);
#              KAFKA_SASL_PORT + KAFKA_SASL_PASSWORD: also a SASL_PLAINTEXT listener (mechanism PLAIN,
#              user "fleetwatch") on that port, for the tests of clients that authenticate;
#              KAFKA_ACL_USERS (with the SASL listener): more SASL users, space-separated, each
#              with KAFKA_SASL_PASSWORD, and Kafka's StandardAuthorizer on, denying what no ACL
#              allows; the PLAINTEXT listener's, "fleetwatch" and the test client certificate's
#              principals are super users (the tests of the ACLs docs/security.md recommends);
#              KAFKA_SSL_PORT: also an SSL listener that requires a client certificate (mutual TLS),
#              with a private CA made here once by openssl/keytool: the CA (ca.pem) and a client
#              certificate and key (client.pem, client.key) for clients are in <data>/tls.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
home="${FLEETWATCH_HOME:-$repo/.fleetwatch}"
port="${KAFKA_PORT:-19092}"
cport="${KAFKA_CONTROLLER_PORT:-19093}"
heap="${KAFKA_HEAP:-512m}"
sasl_port="${KAFKA_SASL_PORT:-}"
ssl_port="${KAFKA_SSL_PORT:-}"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
lib="$home/kafka-lib-$kafka_version"
data="$home/kafka-$port"
pidfile="$data/kafka.pid"
props="$data/server.properties"
tls="$data/tls"

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

# A private CA, the broker's certificate (for 127.0.0.1/localhost) in a PKCS12 keystore, the CA
# in a PKCS12 truststore (client certificates must chain to it), and a client certificate. Test
# material only: made once per data directory, never leaves it.
make_tls() {
  [[ -f "$tls/.complete" ]] && return 0
  command -v openssl >/dev/null || { log "openssl not found (apt-get install openssl)"; exit 1; }
  command -v keytool >/dev/null || { log "keytool not found (it ships with the JRE)"; exit 1; }
  rm -rf "$tls"; mkdir -p "$tls"; chmod 700 "$tls"
  local pass; pass="$(openssl rand -hex 16)"
  printf '%s' "$pass" > "$tls/store.pass"
  ( cd "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
        -subj "/CN=fleetwatch local test CA" 2>/dev/null
    for who in server client; do
      openssl req -newkey rsa:2048 -nodes -keyout "$who.key" -out "$who.csr" -subj "/CN=fleetwatch-$who" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$who.ext"
      openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$who.pem" \
          -days 3650 -extfile "$who.ext" 2>/dev/null
    done
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name broker \
        -out server.p12 -passout "pass:$pass"
    keytool -importcert -noprompt -alias ca -file ca.pem -keystore trust.p12 -storetype PKCS12 \
        -storepass "$pass" >/dev/null 2>&1
    rm -f ./*.csr ./*.ext ./*.srl
    chmod 600 ./*.key store.pass server.p12 trust.p12 )
  touch "$tls/.complete"
}

# ' user_NAME="password"' for each name in KAFKA_ACL_USERS (names checked: they go into the JAAS line)
acl_users() {
  local name
  for name in ${KAFKA_ACL_USERS:-}; do
    [[ "$name" =~ ^[a-z][a-z-]*$ ]] || { log "KAFKA_ACL_USERS: bad user name '$name'"; exit 2; }
    printf ' user_%s="%s"' "$name" "$1"
  done
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
  if [[ -n "$ssl_port" ]]; then
    make_tls
    listeners+=",SSL://127.0.0.1:$ssl_port"
    advertised+=",SSL://127.0.0.1:$ssl_port"
    protocols+=",SSL:SSL"
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
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="fleetwatch" password="$pw" user_fleetwatch="$pw"$(acl_users "$pw");
PROPS
    if [[ -n "${KAFKA_ACL_USERS:-}" ]]; then
      cat >> "$props" <<PROPS
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:fleetwatch;User:CN=fleetwatch-client
PROPS
    fi
  fi
  if [[ -n "$ssl_port" ]]; then
    local sp; sp="$(cat "$tls/store.pass")"
    cat >> "$props" <<PROPS
listener.name.ssl.ssl.keystore.type=PKCS12
listener.name.ssl.ssl.keystore.location=$tls/server.p12
listener.name.ssl.ssl.keystore.password=$sp
listener.name.ssl.ssl.truststore.type=PKCS12
listener.name.ssl.ssl.truststore.location=$tls/trust.p12
listener.name.ssl.ssl.truststore.password=$sp
listener.name.ssl.ssl.client.auth=required
PROPS
  fi
  [[ -z "$sasl_port$ssl_port" ]] || chmod 600 "$props"  # it holds passwords
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

# Topics the tests made pile up in a reused broker (15,700 after a day of local runs: slower every
# run, then out of heap); a broker someone else runs on the port is left alone (start reuses it).
fresh() {
  if port_open "$port" && ! running_pid >/dev/null; then start; return; fi
  stop
  rm -rf "$data"
  start
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  fresh) fresh ;;
  status) port_open "$port" ;;
  *) echo "usage: $0 fetch|start|stop|fresh|status" >&2; exit 2 ;;
esac
