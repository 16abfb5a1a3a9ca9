#!/bin/sh
# moddeb boot test: run inside the test VM (busybox sh) once kbench is loaded.
# moddeb-expect: ^min=\d+ max=\d+ count=\d+ p95=\d+ p90=\d+ p50=\d+ mad=\d+$
# fib_lookup needs a route to answer without err=; lo is enough.
set -e
ip link set lo up
ip route add default dev lo
cat /sys/kernel/kbench/run
