"""Compile-only (sm_90, on a CPU machine): the forward kernel's registers, stack, SASS counts per loop, and whether
ptxas serialises its wgmma instructions (C7511 / C7515), at the head-dim-64 non-causal configs of README.md.
Run from the repo root; the asm goes to /tmp/fwd_split_m_probe/<tag>_<config>/.

    python results/attention/fwd_split_m/compile.py --tag head                   # the committed kernel
    git apply results/attention/fwd_split_m/split_m.patch
    python results/attention/fwd_split_m/compile.py --tag split --consts '{"SPLIT_M": true}' --cfgs "128,128,4,3;128,128,4,2"
"""
import os, re, sys, subprocess, tempfile, json, importlib.util, argparse
from collections import Counter
import triton
sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import kernel_resources as KR

TOOL = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

def sass_stats(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin); f.flush()
        res = subprocess.run([os.path.join(TOOL, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(TOOL, "nvdisasm"), "-c", "-hex", f.name], capture_output=True, text=True).stdout
        if not sass.strip():
            sass = subprocess.run([os.path.join(TOOL, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        sass2 = subprocess.run([os.path.join(TOOL, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    # parse instructions: /*addr*/ [pred] OP ...
    ins = []
    for line in sass2.splitlines():
        mm = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if mm:
            addr = int(mm.group(1), 16); text = mm.group(2).strip()
            op = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text).group(1)
            ins.append((addr, op, text))
    ops = Counter(op.split(".")[0] for _, op, _ in ins)
    # loops: backward branches BRA to lower address
    loops = []
    for i, (addr, op, text) in enumerate(ins):
        if op.startswith("BRA"):
            t = re.search(r"0x([0-9a-f]+)", text)
            if t:
                tgt = int(t.group(1), 16)
                if tgt < addr:
                    body = [x for x in ins if tgt <= x[0] <= addr]
                    bops = Counter(o.split(".")[0] for _, o, _ in body)
                    loops.append(dict(start=tgt, end=addr, n=len(body), hgmma=bops["HGMMA"],
                                      stl=bops["STL"], ldl=bops["LDL"], ops=dict(bops.most_common(12))))
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), total=len(ins), hgmma=ops["HGMMA"],
                stl=ops["STL"], ldl=ops["LDL"], loops=loops, ops=ops), sass2

def load_mod(path):
    spec = importlib.util.spec_from_file_location("flashvar_" + os.path.basename(path).replace(".", "_"), path)
    mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod); return mod

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mod", default="kernels/flash.py")
    ap.add_argument("--tag", default="base")
    ap.add_argument("--cfgs", default="128,128,4,3;128,64,8,3")
    ap.add_argument("--kernel", default="_fwd_kernel")
    ap.add_argument("--maxnreg", type=int, default=None)
    ap.add_argument("--consts", default="{}")
    a = ap.parse_args()
    mod = load_mod(a.mod)
    fn = getattr(mod, a.kernel)
    out = {}
    for cfg in a.cfgs.split(";"):
        m, n, w, s = map(int, cfg.split(","))
        consts = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=m, BLOCK_N=n, IS_CAUSAL=False, VARLEN=False, HAS_DROPOUT=False, **json.loads(a.consts))
        extra = {"maxnreg": a.maxnreg} if a.maxnreg else None
        c = KR.compile_sm90(fn, {k: v for k, v in consts.items() if k in fn.arg_names}, w, s, options=extra)
        st, sass = sass_stats(c.asm["cubin"])
        d = f"/tmp/fwd_split_m_probe/{a.tag}_{m}_{n}_{w}_{s}"
        os.makedirs(d, exist_ok=True)
        for k in ("ttir", "ttgir", "llir", "ptx"):
            open(f"{d}/{k}", "w").write(c.asm[k])
        open(f"{d}/sass", "w").write(sass)
        st2 = {k: v for k, v in st.items() if k != "ops"}
        v = subprocess.run([os.path.join(TOOL, "ptxas"), "-arch=sm_90a", "-v", f"{d}/ptx", "-o", "/dev/null"], capture_output=True, text=True).stderr
        st2["serialized"] = "C7511" in v or "C7510" in v or "serialized" in v
        st2["ptxas"] = [l.strip() for l in v.splitlines() if "serial" in l or "spill" in l or "Used" in l]
        st2["smem"] = c.metadata.shared
        st2["ldgsts"] = st["ops"]["LDGSTS"]
        print(a.tag, cfg, "regs", st2["regs"], "stack", st2["stack"], "total", st2["total"], "hgmma", st2["hgmma"],
              "serialized", st2["serialized"], "smem", st2["smem"], "ldgsts", st2["ldgsts"],
              "loops(n,stl,ldl,hgmma)", [(l["n"], l["stl"], l["ldl"], l["hgmma"]) for l in st["loops"]], flush=True)
        out[cfg] = st2
    json.dump(out, open(f"/tmp/fwd_split_m_probe/{a.tag}.json", "w"), indent=1)
