#!/bin/bash
# Session 39's fifth call (one H100, ~3 minutes), repo root: every form checked at head dims 64 and 128, then the
# causal forms timed (writes gpu_peeled.txt, check_peeled_h100.txt, bench_peeled_h100.txt). The same call ran as
# device_keys_down.sh before the key loop lost its mask branch (`git show d6069fd:results/attention/gluon_fwd_turns/
# device_keys_down.sh`), and the PEEL_MASK forms' as device_peel.sh at 7ae0298.
#   bash results/attention/gluon_fwd_turns/device_peeled.sh
exec bash results/attention/ab_device.sh results/attention/gluon_fwd_turns _peeled "" "--causal-only --rounds 5"
