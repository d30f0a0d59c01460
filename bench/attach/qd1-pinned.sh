#!/bin/bash
# Queue depth 1, attached against local, each with the emulator's thread and
# the submitting thread held to cores 2 and 3 (taskset), alternated.
cd "$(dirname "$0")/../.."
U=${UGDS:-target/release/ugds}
lscpu | grep -E "^(Socket|NUMA node|Core|Thread|Model name)" 
S=/tmp/ugds-q.sock; rm -f $S
taskset -c 2 $U serve --socket $S --emu-null --emu-spin-us 20000 > /tmp/serve.txt 2>&1 &
SP=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
for r in 1 2 3; do
  echo "qd1 attached (owner on 2, client on 3): $(taskset -c 3 $U bench --attach $S -q 1 -d 2 --no-progress 2>&1 | grep -E '^randread|rror' | sed -E 's/\| lat us mean +([0-9.]+).*/| mean \1 us/')"
  echo "qd1 local (cores 2,3):                  $(taskset -c 2,3 $U bench --emu-null -q 1 -d 2 --no-progress 2>&1 | grep -E '^randread|rror' | sed -E 's/\| lat us mean +([0-9.]+).*/| mean \1 us/')"
done
kill -TERM $SP; wait $SP; tail -1 /tmp/serve.txt
