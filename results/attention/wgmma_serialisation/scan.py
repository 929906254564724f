"""Compile-only sm_90 scan: for each shipped launch config, compile through Triton exactly as a launch would
(arguments captured from the product's own launchers and bound by Triton's specialiser), then run the bundled
ptxas with Triton's own flags (-lineinfo -v --gpu-name=sm_90a) on the PTX and record its log: registers, spills,
and any wgmma serialisation warning (C7510/C7511/C7515...).

    python3 results/attention/wgmma_serialisation/scan.py JOBSET   (JOBSET: gluon_fwd, gluon_bwd, ws, fused, bs)
Output: /tmp/wgmma_scan/out/<tag>/{ttgir,ptx,sass,ptxas.log} and /tmp/wgmma_scan/out/<tag>.json
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/wgmma_scan/cache")
sys.path.insert(0, "/work/main")
sys.path.insert(0, "/work/main/scripts")
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
OUT = "/tmp/wgmma_scan/out"


def compile_bound(kernel, args, consts):
    """triton.compile of kernel as kernel[grid](*args, **consts) would specialise it."""
    backend = make_backend(TARGET)
    kw = dict(consts, debug=False, instrumentation_mode="")
    bound, spec, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, spec, opts)
    source = ASTSource
    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=TARGET, options=options.__dict__), signature, constexprs


def analyse(tag, compiled, meta):
    d = os.path.join(OUT, tag)
    os.makedirs(d, exist_ok=True)
    for k in ("ttgir", "ptx"):
        open(f"{d}/{k}", "w").write(compiled.asm[k])
    ptx = f"{d}/ptx"
    log = subprocess.run([os.path.join(BIN, "ptxas"), "-lineinfo", "-v", "--gpu-name=sm_90a", ptx, "-o",
                          f"{d}/ptxas.cubin"], capture_output=True, text=True)
    text = log.stdout + log.stderr
    open(f"{d}/ptxas.log", "w").write(text)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    open(f"{d}/sass", "w").write(sass)
    m = re.search(r"REG:(\d+) STACK:(\d+)", res)
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", mm.group(1)).split()[0]
                  for mm in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", sass, re.MULTILINE))
    # SASS: each HGMMA followed (before the next HGMMA) by a WARPGROUP.DEPBAR.LE gsb0, 0x0 = serialised chain
    lines = [mm.group(1) for mm in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", sass, re.MULTILINE)]
    hg = [i for i, l in enumerate(lines) if "HGMMA" in l]
    waited = 0
    for a, b in zip(hg, hg[1:] + [len(lines)]):
        if any("WARPGROUP.DEPBAR.LE gsb0, 0x0" in l for l in lines[a + 1:b]):
            waited += 1
    setmax = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", compiled.asm["ptx"])
    r = dict(tag=tag, **meta,
             regs=int(m.group(1)), stack=int(m.group(2)), smem=compiled.metadata.shared,
             hgmma=sum(v for k, v in ops.items() if k.startswith("HGMMA")),
             hgmma_followed_by_depbar0=waited,
             warpgroup_arrive=sum(v for k, v in ops.items() if k.startswith("WARPGROUP.ARRIVE")),
             warpgroup_depbar=sum(v for k, v in ops.items() if k.startswith("WARPGROUP.DEPBAR")),
             stl=sum(v for k, v in ops.items() if k.startswith("STL")),
             ldl=sum(v for k, v in ops.items() if k.startswith("LDL")),
             sass_total=sum(ops.values()),
             setmaxnreg_ptx=setmax,
             ptxas_rc=log.returncode,
             ptxas_used=[l.strip() for l in text.splitlines() if "Used" in l],
             ptxas_spill=[l.strip() for l in text.splitlines() if "spill" in l],
             ptxas_warn=[l.strip() for l in text.splitlines() if "warning" in l.lower() or "C75" in l],
             serialised=bool(re.search(r"C75\d\d|serializ|serialis", text)))
    json.dump(r, open(f"{OUT}/{tag}.json", "w"), indent=1)
    print(json.dumps({k: r[k] for k in ("tag", "regs", "stack", "smem", "hgmma", "hgmma_followed_by_depbar0",
                                         "serialised", "ptxas_warn", "ptxas_used", "ptxas_spill")}), flush=True)
    return r


def run_job(tag, kernel, args, consts, meta):
    if os.path.exists(f"{OUT}/{tag}.json"):
        print("skip", tag, flush=True)
        return
    t = time.time()
    try:
        compiled, sig, cx = compile_bound(kernel, args, consts)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        json.dump(dict(tag=tag, **meta, error=repr(e)[:2000]), open(f"{OUT}/{tag}.err.json", "w"))
        return
    meta = dict(meta, compile_s=round(time.time() - t, 1),
                constexprs={str(k): repr(v) for k, v in cx.items()})
    analyse(tag, compiled, meta)


def capture(module_list):
    captured = []

    def fake(kernel, grid, args, consts):
        captured.append((kernel, args, dict(consts)))
    for mod in module_list:
        mod.launch = fake
    return captured


# ------------------------------------------------------------------------------------------- job sets
def _qkv(batch, seqlen, nheads, d, n=3, dtype=torch.bfloat16):
    return [torch.empty(batch, seqlen, nheads, d, dtype=dtype) for _ in range(n)]


HEADS = {32: 64, 64: 32, 128: 16, 256: 8}  # 2048 / d: the benchmarks' model width
SEQ, BATCH = int(os.environ.get("SCAN_SEQ", 4096)), int(os.environ.get("SCAN_BATCH", 4))
SFX = os.environ.get("SCAN_SFX", "")


def gluon_fwd():
    import kernels.flash_gluon as G
    cap = capture([G])
    for d in (64, 128, 256):
        for causal in (False, True):
            q, k, v, o = _qkv(BATCH, SEQ, HEADS[d], d, 4)
            lse = torch.empty(BATCH, HEADS[d], SEQ, dtype=torch.float32)
            cap.clear()
            G.gluon_forward(q, k, v, o, lse, d ** -0.5 * 1.4427, causal)
            kernel, args, consts = cap[0]
            run_job(f"gluon_fwd_hd{d}_{'causal' if causal else 'noncausal'}{SFX}", kernel, args, consts,
                    dict(kernel="flash_gluon._fwd_kernel", head_dim=d, causal=causal,
                         config=f"FWD_TILES={G.FWD_TILES[d]}, 4 warps (+4+1 in partitions), CONSUMER_REGS={G.CONSUMER_REGS}",
                         shape=f"b{BATCH} s{SEQ} h{HEADS[d]}"))


def gluon_bwd():
    import kernels.flash_gluon as G
    cap = capture([G])
    for d in (64, 128, 256):
        for causal in (False, True):
            q, k, v, do, dq, dk, dv = _qkv(BATCH, SEQ, HEADS[d], d, 7)
            lse = torch.empty(BATCH, HEADS[d], SEQ, dtype=torch.float32)
            delta = torch.empty_like(lse)
            cap.clear()
            G.gluon_backward(do, q, k, v, lse, delta, dq, dk, dv, d ** -0.5, causal)
            kernel, args, consts = cap[0]
            run_job(f"gluon_bwd_hd{d}_{'causal' if causal else 'noncausal'}{SFX}", kernel, args, consts,
                    dict(kernel="flash_gluon._bwd_kernel", head_dim=d, causal=causal,
                         config=f"BWD_TILES={G.BWD_TILES[d]}, BWD_WARPS={G.BWD_WARPS} (+1+1)",
                         shape=f"b{BATCH} s{SEQ} h{HEADS[d]}"))


def _patch_flash():
    import kernels.flash as F
    F._ws_platform_unsupported = lambda q: None
    F._autotuning = lambda: False
    F._ensure_tma_allocator = lambda: None
    F._fused_bwd = lambda q, p, bd: p > 0 and bd <= 64
    return F


def ws():
    F = _patch_flash()
    cap = capture([F])
    d = 128
    for causal in (False, True):
        q, k, v = _qkv(BATCH, SEQ, HEADS[d], d)
        cap.clear()
        F._flash_fwd(q, k, v, d ** -0.5, causal, 0.0, False, None, None, None, None, warp_spec=True)
        kernel, args, consts = cap[0]
        assert consts.get("WARP_SPEC") is True, consts
        cfg = (consts["BLOCK_M"], consts["BLOCK_N"], consts["num_warps"], consts["num_stages"])
        run_job(f"ws_fwd_hd128_{'causal' if causal else 'noncausal'}", kernel, args, consts,
                dict(kernel="flash._fwd_kernel WARP_SPEC", head_dim=d, causal=causal, config=str(cfg),
                     shape=f"b{BATCH} s{SEQ} h{HEADS[d]}"))


def fused(which="all"):
    F = _patch_flash()
    cap = capture([F])
    for d in (32, 64):
        for causal in (False, True):
            if which != "all" and which != f"{d}":
                continue
            q, k, v, o, do = _qkv(BATCH, 1024, HEADS[d], d, 5)
            lse = torch.empty(BATCH, HEADS[d], 1024, dtype=torch.float32)
            cap.clear()
            F._flash_bwd(do, q, k, v, o, lse, torch.zeros(1, dtype=torch.int64), d ** -0.5, causal, 0.1, False,
                         None, None, None, None, gluon=False)
            kernel, args, consts = next(c for c in cap if c[2].get("FUSED_DQ"))
            for m, n, w, s in F._FUSED_SHAPES:
                c = dict(consts, BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
                run_job(f"fused_hd{d}_{'causal' if causal else 'noncausal'}_{m}_{n}_{w}_{s}", kernel, args, c,
                        dict(kernel="flash._bwd_dkdv_kernel FUSED_DQ DQ_TMA dropout", head_dim=d, causal=causal,
                             config=str((m, n, w, s)), shape=f"b{BATCH} s1024 h{HEADS[d]} dropout 0.1"))


def bs(variants=((128, 0.0, (64, 128)),)):
    import kernels.blocksparse as B
    import kernels.flash as F
    from kernels.sparsity import butterfly
    cap = capture([B, F])
    n = 16384
    for block, p, dims in variants:
        for d in dims:
            for causal in (False, True):
                batch, nheads = 1, 2048 // d
                q, k, v, o, do = _qkv(batch, n, nheads, d, 5)
                lse = torch.empty(batch, nheads, n, dtype=torch.float32)
                tables = B._kernel_tables(butterfly(n, n, block), causal, d, "cpu", False, n, n)
                cap.clear()
                B._bs_forward(q, k, v, tables, block, causal, d ** -0.5, p)
                B._bs_backward(do, q, k, v, o, lse, torch.zeros(1, dtype=torch.int64), tables, block, causal,
                               d ** -0.5, p)
                cs = ("causal" if causal else "noncausal") + ("_drop" if p else "") + ("" if block == 128 else f"_blk{block}")
                shape = f"b1 s{n} h{nheads} butterfly block {block}" + (f" dropout {p}" if p else "")
                for kernel, args, consts in cap:
                    if kernel is B._bs_fwd_kernel:
                        cfg = (consts["BLOCK_M"], consts["BLOCK_N"], consts["num_warps"], consts["num_stages"])
                        run_job(f"bs_fwd_hd{d}_{cs}", kernel, args, consts,
                                dict(kernel="blocksparse._bs_fwd_kernel", head_dim=d, causal=causal, config=str(cfg),
                                     shape=shape))
                    elif kernel is B._bs_bwd_kernel:
                        cfg = tuple(consts[x] for x in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps",
                                                        "num_stages"))
                        run_job(f"bs_bwd_hd{d}_{cs}_role{consts['ROLE']}", kernel, args, consts,
                                dict(kernel=f"blocksparse._bs_bwd_kernel ROLE={consts['ROLE']}", head_dim=d,
                                     causal=causal, config=str(cfg), shape=shape))


def control():
    """The earlier probe's known-serialised config: dense _fwd_kernel, hd 64, (128, 128, 4, 3), non-causal
    (results/attention/fwd_split_m: C7511, 255 regs, 64 B stack), plus the shipped hd-64 non-causal pick (128, 64, 8, 3)."""
    F = _patch_flash()
    cap = capture([F])
    d = 64
    q, k, v = _qkv(BATCH, 1024, HEADS[d], d)
    cap.clear()
    F._flash_fwd(q, k, v, d ** -0.5, False, 0.0, False, None, None, None, None, warp_spec=False)
    kernel, args, consts = cap[0]
    for m, n_, w, s in ((128, 128, 4, 3), (128, 64, 8, 3)):
        c = dict(consts, BLOCK_M=m, BLOCK_N=n_, num_warps=w, num_stages=s)
        run_job(f"control_fwd_hd64_noncausal_{m}_{n_}_{w}_{s}", kernel, args, c,
                dict(kernel="flash._fwd_kernel (control)", head_dim=d, causal=False, config=str((m, n_, w, s)),
                     shape=f"b{BATCH} s1024 h{HEADS[d]}"))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    job = sys.argv[1]
    {"gluon_fwd": gluon_fwd, "gluon_bwd": gluon_bwd, "ws": ws, "bs": bs,
     "bs_more": lambda: bs(((128, 0.1, (64, 128)), (64, 0.0, (128,)))), "control": control,
     "fused": lambda: fused(sys.argv[2] if len(sys.argv) > 2 else "all")}[job]()
