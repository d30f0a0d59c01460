#!/bin/bash
# Issue 43 on 16 cores (an emulated null controller served by ugds serve):
# one attached process with 8 lent queue pairs, 4 attached processes with 2
# each, and one local process with 8 (no serving), alternated; then queue
# depth 1 attached and local, alternated. The served emulator spins 20 ms
# after its last work, as `ugds bench` has its own emulator do.
cd "$(dirname "$0")/../.."
U=${UGDS:-target/release/ugds}
nproc
S=/tmp/ugds-o.sock; rm -f $S
$U serve --socket $S --emu-null --emu-queues 64 --emu-spin-us 20000 --queues-per-process 16 > /tmp/serve.txt 2>&1 &
SP=$!
for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
head -1 /tmp/serve.txt
for r in 1 2 3; do
  echo "== round $r"
  echo "attached 1x8: $($U bench --attach $S -t 8 -q 32 -d 2 --no-progress 2>&1 | grep -E '^randread|rror')"
  echo "attached 4x2: $($U bench --attach $S -p 4 -t 2 -q 32 -d 2 2>&1 | grep -E '^sum|rror')"
  echo "local    1x8: $($U bench --emu-null --emu-queues 64 -t 8 -q 32 -d 2 --no-progress 2>&1 | grep -E '^randread|rror')"
done
for r in 1 2 3; do
  echo "qd1 attached: $($U bench --attach $S -q 1 -d 2 --no-progress 2>&1 | grep -E '^randread|rror')"
  echo "qd1 local:    $($U bench --emu-null -q 1 -d 2 --no-progress 2>&1 | grep -E '^randread|rror')"
done
kill -TERM $SP; wait $SP; tail -2 /tmp/serve.txt
