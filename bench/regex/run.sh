#!/bin/bash
# run.sh BIN CONF: server on CPU 1, wrk -t1 -c32 -d5s on CPU 0; prints
# req/s and the server's CPU time (utime+stime) per request in µs.
bin=$1; conf=$2
rm -f ${BENCH_DIR:-/tmp/rxbench}/nginx.pid
taskset -c 1 $bin -p ${BENCH_DIR:-/tmp/rxbench} -c $conf -g 'daemon off; master_process off;' 2>/dev/null &
pid=$!
sleep 1
cpu() { awk '{print $14+$15}' /proc/$pid/stat; }
a=$(cpu)
out=$(taskset -c 0 wrk -t1 -c32 -d5s -H "User-Agent: Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36" http://127.0.0.1:18990/app39/foo/123.html)
b=$(cpu)
n=$(echo "$out" | awk '/requests in/ {print $1}')
rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
tck=$(getconf CLK_TCK)
echo "$rps req/s, $(python3 -c "print(round(($b-$a)/$tck*1e6/$n,1))") µs CPU/req"
kill $pid; wait $pid 2>/dev/null
