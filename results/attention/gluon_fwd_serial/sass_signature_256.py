"""Head dim 256's shipped Gluon kernels as sm_90 SASS signatures (instruction count and a hash of the instruction text
with addresses and constant-bank offsets stripped, as ../gluon_bwd_early_release/sass_signature.py does): the forward
with its launcher forms (K_AHEAD) and the backward with its shipped flags (STATS_AHEAD, EARLY_RELEASE). Run in two
checkouts, the lines tell whether a source change altered what runs there (`sass_signature_256.txt`: SERIAL added,
off, against 9a54a5f).

    python results/attention/gluon_fwd_serial/sass_signature_256.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gluon_bwd_early_release"))
from sass_signature import bwd_sig, fwd_sig  # noqa: E402  (puts scripts/ and the checkout on sys.path)

for causal in (False, True):
    print("fwd", 256, causal, fwd_sig(256, causal), flush=True)
    print("bwd shipped flags", 256, causal, bwd_sig(256, causal, STATS_AHEAD=True, EARLY_RELEASE=True), flush=True)
