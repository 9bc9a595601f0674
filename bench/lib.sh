# Shared by bench/instructions.sh and bench/syscalls.sh (sourced, not run):
# the options both take, the served directory and the nginx.conf both
# servers run on (the shared bench's `small` location: sendfile,
# tcp_nopush, tcp_nodelay, access_log off, optional open_file_cache), the
# URL and the request headers wrk sends, and starting a server.
#
# Options (parsed by bench_args; what is left is the list of binaries):
#   --ocf on|off      open_file_cache (default off)
#   --size 1k|16k|N   the file's size (default 1k)
#   --conn            `Connection: close` on every request (one per connection)
#   --workers N       N workers under a master on one listener (syscalls.sh)
#   --clients N       wrk's connections (default 4)
#   --port N          the listening port
#   --uri PATH        the URI requested (default /f.bin; e.g. /missing for
#                     the 404 path, which logs nginx's `open() ... failed` line)
#   --gzip LEVEL      `gzip on; gzip_comp_level LEVEL;` in the http block
#   --accept ENC      an `Accept-Encoding: ENC` request header
#
# After bench_args and bench_setup: $W (the work directory, removed on
# exit), $URL, the array H of wrk/curl header options, $MODE (ka|conn),
# $OCF, $SIZE, $WP (worker_processes), $CONNS, and $TAG, a label of the
# options for the result lines.

OCF=off SIZE=1k MODE=ka WORKERS=0 CONNS=4 URI=/f.bin GZIP="" ACCEPT=""

# bench_args DEFAULT_PORT "$@": sets the options; BINS gets the rest.
bench_args() {
  PORT=$1
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --ocf) OCF=$2; shift 2 ;;
      --size) SIZE=$2; shift 2 ;;
      --conn) MODE=conn; shift ;;
      --workers) WORKERS=$2; shift 2 ;;
      --clients) CONNS=$2; shift 2 ;;
      --port) PORT=$2; shift 2 ;;
      --uri) URI=$2; shift 2 ;;
      --gzip) GZIP=$2; shift 2 ;;
      --accept) ACCEPT=$2; shift 2 ;;
      --*) echo "unknown option $1" >&2; return 2 ;;
      *) break ;;
    esac
  done
  BINS=("$@")
}

# bench_setup PREFIX: the work directory /var/tmp/PREFIX.XXXXXX with
# www/f.bin and nginx.conf, and the request.
bench_setup() {
  W=$(mktemp -d "/var/tmp/$1.XXXXXX")
  trap 'rm -rf "$W"' EXIT
  mkdir -p "$W/www" "$W/logs"
  chmod 755 "$W" "$W/www"
  local n
  case "$SIZE" in 1k) n=1024 ;; 16k) n=16384 ;; *) n=$(numfmt --from=iec "${SIZE^^}") ;; esac
  head -c "$n" /dev/urandom > "$W/www/f.bin"
  chmod 644 "$W/www/f.bin"
  local ocf_lines="" gzip_lines=""
  [ "$OCF" = on ] && ocf_lines="open_file_cache max=1000 inactive=60s; open_file_cache_valid 60s; open_file_cache_min_uses 1; open_file_cache_errors on;"
  [ -n "$GZIP" ] && gzip_lines="gzip on; gzip_comp_level $GZIP;"
  WP=1
  [ "$WORKERS" -gt 0 ] && WP=$WORKERS
  cat > "$W/nginx.conf" <<CONF
worker_processes $WP;
error_log $W/logs/error.log;
pid $W/logs/nginx.pid;
events { worker_connections 10000; }
http {
    access_log off;
    sendfile on; tcp_nopush on; tcp_nodelay on;
    keepalive_timeout 65s; keepalive_requests 1000000;
    $ocf_lines
    $gzip_lines
    server { listen 127.0.0.1:$PORT; server_name localhost; root $W/www; location / { } }
}
CONF
  H=()
  [ "$MODE" = conn ] && H+=(-H "Connection: close")
  [ -n "$ACCEPT" ] && H+=(-H "Accept-Encoding: $ACCEPT")
  URL="http://127.0.0.1:$PORT$URI"
  TAG="ocf=$OCF $SIZE $MODE"
  [ "$URI" != /f.bin ] && TAG="$TAG uri=$URI"
  [ -n "$GZIP" ] && TAG="$TAG gzip=$GZIP"
  [ -n "$ACCEPT" ] && TAG="$TAG accept=$ACCEPT"
  return 0
}

# bench_wait_up: until the server answers $URL (any status), or the
# process $1 is gone (then its stderr file $2 is shown).
bench_wait_up() {
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "${H[@]}" "$URL" || true)" != 000 ] && return 0
    kill -0 "$1" 2>/dev/null || { cat "$2" >&2; return 1; }
    sleep 0.2
  done
  echo "server did not answer $URL" >&2
  return 1
}
