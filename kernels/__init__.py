"""IO-aware exact attention kernels behind one interface.

- `flash_attn_func`, `flash_attn_varlen_func`: the fused Triton FlashAttention kernel (kernels/flash.py; on Hopper
  its head-dim-128 forward is the Gluon kernel of kernels/flash_gluon.py).
- `blocksparse_attn_func`, `blocksparse_attn_varlen_func` and the sparsity patterns: block-sparse FlashAttention (kernels/blocksparse.py).
- `ring_attn_func`: ring attention, one sequence split over the ranks of a process group (kernels/ring.py).
- `standard_attention`: the plain-PyTorch baseline and test reference (kernels/standard.py).
- `kernels.attention`: the nn.Module wrappers that `configs/attn/*.yaml` name; `kernels.padding`: PackedBatch.

Kernel modules import triton lazily so that the standard path works where triton is absent.
"""
from kernels.standard import standard_attention

_LAZY = {
    "flash_attn_func": "kernels.flash",
    "flash_attn_varlen_func": "kernels.flash",
    "blocksparse_attn_func": "kernels.blocksparse",
    "blocksparse_attn_varlen_func": "kernels.blocksparse",
    "ring_attn_func": "kernels.ring",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


__all__ = ["standard_attention", *_LAZY]
