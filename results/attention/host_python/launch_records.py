"""Every launch the attention launchers make, as a canonical record, on a machine without a GPU: the reference a
rewrite of the host path (session 47's "plan per geometry") must reproduce exactly.

`kernels.flash._flash_fwd` and `_flash_bwd`, and kernels.blocksparse's `_bs_forward` and `_bs_backward`, run with every
Triton / Gluon launch replaced by a recorder, the Hopper-only
checks answering as on the H100 (132 SMs, sm_90) and FLASH_AUTOTUNE=0 (fixed configs). Each launch is written as its
kernel, grid, positional arguments and constexprs. A tensor argument is written by what it is, not where it lies: the
role of its storage (an input's name, or the n-th buffer the launchers allocated), its offset in it, shape, strides and
dtype; a host TMA descriptor by its base (the same way), shape, strides, block shape, layout and padding. Two trees
make the same launches on these shapes when this script prints the same text in both.

    FLASH_AUTOTUNE=0 python results/attention/host_python/launch_records.py > launch_records_cpu.txt
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import kernels.flash as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launchers_cpu import stub_launches  # noqa: E402

records = []


def _record(kernel, grid, args, constexprs):
    fn = getattr(kernel, "fn", kernel)  # a JITFunction's Python function: flash.py and flash_gluon.py share names
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', kernel)}"
    records.append((name, tuple(grid), tuple(args), dict(constexprs)))




class Roles:
    """Names tensors by their storage: the inputs by name, other storages in order of first sight."""

    def __init__(self, **inputs):
        self.names = {t.untyped_storage().data_ptr(): name for name, t in inputs.items()}

    def tensor(self, t):
        base = t.untyped_storage().data_ptr()
        if base not in self.names:
            self.names[base] = f"buffer{sum(n.startswith('buffer') for n in self.names.values())}"
        return (f"{self.names[base]}+{t.storage_offset()}", tuple(t.shape), tuple(t.stride()), str(t.dtype))

    def value(self, a):
        if isinstance(a, torch.Tensor):
            return self.tensor(a)
        if type(a).__name__ == "TensorDescriptor":
            return ("desc", self.tensor(a.base), list(a.shape), list(a.strides), list(a.block_shape),
                    repr(getattr(a, "layout", None)), a.padding)
        if isinstance(a, float):
            return float(f"{a:.12g}")
        return a


def write(label, roles):
    print(text(label, roles), end="")


def text(label, roles) -> str:
    lines = [f"## {label}"]
    for name, grid, args, consts in records:
        lines.append(f"{name} grid={grid}")
        lines.append(f"  args: {[roles.value(a) for a in args]}")
        lines.append(f"  constexprs: { {k: roles.value(v) for k, v in sorted(consts.items())} }")
    records.clear()
    return "\n".join(lines) + "\n"


def case(label, batch, seqlen, nheads, nheads_k, head_dim, causal, dropout_p, dtype=torch.bfloat16, packed=False):
    g = torch.Generator().manual_seed(0)
    if packed:  # GPT-2's layout: q, k, v and their gradients are views of one (batch, seqlen, 3, heads, dim)
        qkv = torch.randn(batch, seqlen, 3, nheads, head_dim, generator=g).to(dtype)
        q, k, v = qkv.unbind(2)
        dqkv = torch.empty_like(qkv)
        out = dqkv.unbind(2)
        inputs = dict(qkv=qkv, dqkv=dqkv)
    else:
        q = torch.randn(batch, seqlen, nheads, head_dim, generator=g).to(dtype)
        k, v = (torch.randn(batch, seqlen, nheads_k, head_dim, generator=g).to(dtype) for _ in range(2))
        out = None
        inputs = dict(q=q, k=k, v=v)
    forward = []
    for _ in range(2):  # the second call takes the first one's plan: the same launches
        torch.manual_seed(1)
        o, lse, seed = F._flash_fwd(q, k, v, head_dim ** -0.5, causal, dropout_p, False, None, None, seqlen, seqlen)
        forward.append(text(f"{label}: forward", Roles(**inputs, o=o, lse=lse, seed=seed)))
    assert forward[0] == forward[1], label
    print(forward[0], end="")
    do = torch.randn(o.shape, generator=g).to(dtype)
    backward = []
    for _ in range(2):  # the second call takes the first one's plan (kernels.flash._plan): the same launches
        F._flash_bwd(do, q, k, v, o, lse, seed, head_dim ** -0.5, causal, dropout_p, False, None, None, seqlen, seqlen,
                     out=out)
        backward.append(text(f"{label}: backward", Roles(**inputs, o=o, lse=lse, seed=seed, do=do)))
    assert backward[0] == backward[1], label
    print(backward[0], end="")


def varlen_case(label, batches, nheads, head_dim, causal, dropout_p):
    """flash's varlen launchers on packed (total, 3, heads, dim) projections, as BERT calls them: one batch of sequence
    lengths after another (their packed lengths differ; the varlen plans are made without it), each forward and
    backward twice."""
    for lengths in batches:
        g = torch.Generator().manual_seed(0)
        cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        total, longest = int(cu[-1]), max(lengths)
        qkv = torch.randn(total, 3, nheads, head_dim, generator=g).to(torch.bfloat16)
        q, k, v = qkv.unbind(1)
        dqkv = torch.empty_like(qkv)
        calls = []
        for _ in range(2):
            torch.manual_seed(1)
            o, lse, seed = F._flash_fwd(q, k, v, head_dim ** -0.5, causal, dropout_p, True, cu, cu, longest, longest)
            calls.append(text(f"{label}, lengths {lengths}: forward", Roles(qkv=qkv, cu=cu, o=o, lse=lse, seed=seed)))
        do = torch.randn(o.shape, generator=g).to(torch.bfloat16)
        for _ in range(2):
            F._flash_bwd(do, q, k, v, o, lse, seed, head_dim ** -0.5, causal, dropout_p, True, cu, cu, longest, longest,
                         out=dqkv.unbind(1))
            calls.append(text(f"{label}, lengths {lengths}: backward",
                              Roles(qkv=qkv, dqkv=dqkv, cu=cu, o=o, lse=lse, seed=seed, do=do)))
        assert calls[0] == calls[1] and calls[2] == calls[3], label
        print(calls[0] + calls[2], end="")


def ring_block_case(label, batch, seqlen, nheads, head_dim, causal):
    """kernels/ring.py's block calls: the forward's output in float32, the backward with the caller's delta and float32
    gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(batch, seqlen, nheads, head_dim, generator=g).to(torch.bfloat16) for _ in range(4))
    o, lse, seed = F._flash_fwd(q, k, v, head_dim ** -0.5, causal, 0.0, False, None, None, seqlen, seqlen,
                                out_dtype=torch.float32)
    write(f"{label}: forward", Roles(q=q, k=k, v=v, o=o, lse=lse))
    delta = torch.randn(lse.shape, generator=g)
    F._flash_bwd(do, q, k, v, o, lse, seed, head_dim ** -0.5, causal, 0.0, False, None, None, seqlen, seqlen,
                 delta=delta, grad_dtype=torch.float32)
    write(f"{label}: backward", Roles(q=q, k=k, v=v, o=o, lse=lse, do=do, delta=delta))


def blocksparse_case(label, batch, seqlen, nheads, nheads_k, head_dim, causal, dropout_p, varlen=False):
    """kernels.blocksparse's launchers on a random layout of 64-token blocks (dense, or varlen of three sequences)."""
    import kernels.blocksparse as B
    from kernels.sparsity import BlockSparseLayout

    g = torch.Generator().manual_seed(0)
    nb = seqlen // 64
    blocks = (torch.rand(1, nb, nb, generator=g) < 0.25) | torch.eye(nb, dtype=torch.bool)
    if varlen:
        cu = torch.tensor([0, seqlen // 2, seqlen // 2 + seqlen // 4, seqlen], dtype=torch.int32)
        q = torch.randn(seqlen, nheads, head_dim, generator=g).to(torch.bfloat16)
        k, v = (torch.randn(seqlen, nheads_k, head_dim, generator=g).to(torch.bfloat16) for _ in range(2))
        cu_q = cu_k = cu
        max_q = max_k = seqlen // 2
        layout = B._as_layout(BlockSparseLayout(blocks, 64, seqlen, seqlen), None, nheads, max_q, max_k, varlen=True)
        scale = head_dim ** -0.5  # as B._varlen_setup, whose input checks want CUDA tensors here
        tables = B._kernel_tables(layout, causal, head_dim, q.device, True, max_q, max_k)
    else:
        q = torch.randn(batch, seqlen, nheads, head_dim, generator=g).to(torch.bfloat16)
        k, v = (torch.randn(batch, seqlen, nheads_k, head_dim, generator=g).to(torch.bfloat16) for _ in range(2))
        _, causal, scale, tables = B._dense_setup(q, k, blocks, 64, None, causal)
        cu_q = cu_k = max_q = max_k = None
    torch.manual_seed(1)
    o, lse, seed = B._bs_forward(q, k, v, tables, 64, causal, scale, dropout_p, cu_q, cu_k, max_q, max_k)
    do = torch.randn(o.shape, generator=g).to(torch.bfloat16)
    inputs = dict(q=q, k=k, v=v, o=o, lse=lse, seed=seed, do=do, **{f"table{i}": t for i, t in enumerate(tables)})
    if varlen:
        inputs["cu"] = cu
    write(f"{label}: forward", Roles(**inputs))
    backward = []
    for _ in range(2):  # as the dense launchers' backward: a second call, from its plan where there is one
        B._bs_backward(do, q, k, v, o, lse, seed, tables, 64, causal, scale, dropout_p, cu_q, cu_k, max_q, max_k)
        backward.append(text(f"{label}: backward", Roles(**inputs)))
    assert backward[0] == backward[1], label
    print(backward[0], end="")


def main():
    stub_launches(_record)
    print(f"# torch {torch.__version__}; FLASH_AUTOTUNE={os.environ.get('FLASH_AUTOTUNE', '1')}; launches recorded, "
          "not run; Hopper checks as on the H100")
    case("GPT-2 small, packed, causal, dropout 0.1", 2, 1024, 12, 12, 64, True, 0.1, packed=True)
    case("GPT-2 small, packed, causal, no dropout", 2, 1024, 12, 12, 64, True, 0.0, packed=True)
    case("head dim 64, non-causal, dropout 0.1", 1, 2048, 4, 4, 64, False, 0.1)
    case("head dim 128, non-causal", 1, 2048, 4, 4, 128, False, 0.0)
    case("head dim 128, causal, fp16", 1, 4096, 2, 2, 128, True, 0.0, dtype=torch.float16)
    case("head dim 256, causal", 1, 1024, 2, 2, 256, True, 0.0)
    case("head dim 128, causal, dropout 0.1 (no Gluon dropout at 128)", 1, 1024, 2, 2, 128, True, 0.1)
    case("grouped-query heads (8 over 2), head dim 64", 1, 1024, 8, 2, 64, True, 0.0)
    case("300 tokens (no Gluon), head dim 64", 2, 300, 4, 4, 64, False, 0.0)
    case("head dim 32, dropout 0.1 (the fused backward)", 2, 256, 4, 4, 32, False, 0.1)
    bert = [(200, 77, 512), (190, 60, 500), (300, 5)]  # the first two: one varlen plan
    varlen_case("varlen packed, BERT's heads, no dropout", bert, 16, 64, False, 0.0)
    varlen_case("varlen packed, causal, dropout 0.1", bert, 4, 64, True, 0.1)
    varlen_case("varlen packed, head dim 32, dropout 0.1 (the fused backward)", bert, 4, 32, False, 0.1)
    ring_block_case("a ring block (float32 output, the caller's delta, float32 gradients)", 1, 512, 4, 64, True)
    blocksparse_case("block-sparse, head dim 64, causal, dropout 0.1", 2, 512, 4, 4, 64, True, 0.1)
    blocksparse_case("block-sparse, head dim 128, grouped-query heads (4 over 2)", 1, 512, 4, 2, 128, False, 0.0)
    blocksparse_case("block-sparse varlen, head dim 64, causal", 1, 512, 4, 4, 64, True, 0.0, varlen=True)


if __name__ == "__main__":
    main()
