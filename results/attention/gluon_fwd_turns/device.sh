#!/bin/bash
# The forward-turns experiment's device call (one H100, ~3-4 minutes), repo root: every form checked at head dims 64
# and 128, then timed, both masks (writes gpu.txt, check_h100.txt, bench_h100.txt)
#   bash results/attention/gluon_fwd_turns/device.sh
exec bash results/attention/ab_device.sh results/attention/gluon_fwd_turns "" "" "--rounds 5"
