"""The markdown table of ab.py's JSON lines: ours before / after (each process's median), cuDNN beside it.

    python results/attention/persistent_short/table.py results/attention/persistent_short/ab_h100.jsonl
"""
import json, statistics as st, sys
from collections import defaultdict
rows=[json.loads(l) for l in open(sys.argv[1])]
d=defaultdict(list); shapes=[]
for r in rows:
    key=(r['hdim'],r['seqlen'],r['causal'])
    if key not in shapes: shapes.append(key)
    for m in ('fwd_ms','fwd_graphed_ms','fwdbwd_ms','fwdbwd_graphed_ms'):
        d[key+(r['provider'],r['tag'],m)].append(r[m])
print("| head dim | tokens | causal | mode | ours before (runs) | ours after (runs) | after speed-up | cuDNN / ours before | cuDNN / ours after |")
print("|---:|---:|---|---|---|---|---:|---:|---:|")
for key in shapes:
    for m in ('fwd_ms','fwd_graphed_ms','fwdbwd_ms','fwdbwd_graphed_ms'):
        b=d[key+('ours','before',m)]; a=d[key+('ours','after',m)]; cu=d[key+('sdpa_cudnn','after',m)]; cub=d[key+('sdpa_cudnn','before',m)]
        f=lambda xs: ", ".join(f"{x:.3f}" for x in xs)
        print(f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | {m[:-3].replace('_graphed',' graphed')} | {f(b)} | {f(a)} | {st.median(b)/st.median(a):.3f} | {st.median(cub)/st.median(b):.3f} | {st.median(cu)/st.median(a):.3f} |")
