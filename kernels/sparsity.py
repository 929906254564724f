"""Block-sparsity layouts for block-sparse FlashAttention (kernels.blocksparse).

A layout is a bool tensor of shape (nheads or 1, ceil(seqlen_q / block_size), ceil(seqlen_k /
block_size)): True where the (query block, key block) pair is computed. Blocks are aligned top-left
(block b covers tokens b * block_size ... (b + 1) * block_size - 1). Token (i, j) is allowed iff its
block is True and, for a causal layout, j <= i + seqlen_k - seqlen_q (bottom-right, as everywhere in
`kernels`).

Patterns (each a function returning a `BlockSparseLayout`; i = query block, j = key block):
- `full`:          every block.
- `causal`:        the blocks that hold at least one causally allowed token; marks the layout causal.
- `local`:         sliding window, |i - j| <= window.
- `global_local`:  local window plus `n_global` global blocks whose rows and columns are all kept
                   (Longformer / BigBird style).
- `strided`:       Sparse Transformer (Child et al., 2019): (i - j) % stride == 0, plus, with
                   local=True, the band |i - j| < stride.
- `butterfly`:     the flat block butterfly used in the FlashAttention paper (after Pixelated
                   Butterfly, Chen et al., 2021): i XOR j in {0, 1, 2, 4, ..., 2**(n_factors - 1)}.
- `random`:        each block kept independently with probability `density` (per head if asked).

Layouts combine with `|` (union) and `&` (intersection); `layout & causal(...)` or
`layout.with_causal()` makes any pattern causal. Each has `to_dense()` (token-level mask),
`density()` (fraction of blocks kept), `sparsity()` and a printable picture (`print(layout)`).
"""
from __future__ import annotations

import math

import torch

from kernels.standard import causal_mask

__all__ = [
    "BlockSparseLayout",
    "full",
    "causal",
    "local",
    "global_local",
    "strided",
    "butterfly",
    "random",
    "make_layout",
    "PATTERNS",
]


def cdiv(a: int, b: int) -> int:
    """Ceiling division on host integers (plain Python: triton.cdiv costs microseconds per call)."""
    return -(-a // b)


def check_layout_tensor(blocks: torch.Tensor, nheads: int | None, nblocks_q: int, nblocks_k: int) -> None:
    """Raise a ValueError/TypeError naming the expected shape when `blocks` is not a valid layout."""
    heads = "1" if nheads in (None, 1) else f"{nheads} or 1"
    expected = f"({heads}, {nblocks_q}, {nblocks_k})"
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"layout must be a bool tensor of shape {expected}, got {type(blocks).__name__}")
    if blocks.dtype != torch.bool:
        raise TypeError(f"layout must be a bool tensor of shape {expected}, got dtype {blocks.dtype}")
    ok = blocks.dim() == 3 and tuple(blocks.shape[1:]) == (nblocks_q, nblocks_k)
    ok = ok and (blocks.shape[0] == 1 or (nheads is not None and blocks.shape[0] == nheads))
    if not ok:
        raise ValueError(f"layout must have shape {expected} (nheads or 1, ceil(seqlen_q / block_size), "
                         f"ceil(seqlen_k / block_size)), got {tuple(blocks.shape)}")


class BlockSparseLayout:
    """A block mask plus the geometry it was built for.

    blocks: bool (nheads or 1, ceil(seqlen_q / block_size), ceil(seqlen_k / block_size)).
    causal: whether the token-level causal mask applies on top of the blocks.
    The kernel's compressed index tables are cached on the object (`_cache`), so reusing one layout
    across layers and steps compresses it once per (tile sizes, device).
    """

    def __init__(self, blocks: torch.Tensor, block_size: int, seqlen_q: int | None = None,
                 seqlen_k: int | None = None, causal: bool = False):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if blocks.dim() == 2:
            blocks = blocks.unsqueeze(0)
        self.block_size = int(block_size)
        self.seqlen_q = int(seqlen_q) if seqlen_q is not None else blocks.shape[-2] * block_size
        self.seqlen_k = int(seqlen_k) if seqlen_k is not None else blocks.shape[-1] * block_size
        check_layout_tensor(blocks, blocks.shape[0], self.nblocks_q, self.nblocks_k)
        self.blocks = blocks
        self.causal = bool(causal)
        self._cache: dict = {}

    # geometry -----------------------------------------------------------------------------------
    @property
    def nblocks_q(self) -> int:
        return cdiv(self.seqlen_q, self.block_size)

    @property
    def nblocks_k(self) -> int:
        return cdiv(self.seqlen_k, self.block_size)

    @property
    def nheads(self) -> int:
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple:
        return tuple(self.blocks.shape)

    def to(self, device) -> "BlockSparseLayout":
        if self.blocks.device == torch.device(device):
            return self
        return BlockSparseLayout(self.blocks.to(device), self.block_size, self.seqlen_q, self.seqlen_k,
                                 self.causal)

    # views --------------------------------------------------------------------------------------
    def to_dense(self) -> torch.Tensor:
        """Token-level mask, bool (nheads or 1, seqlen_q, seqlen_k), True where attention is allowed."""
        bs = self.block_size
        dense = self.blocks.repeat_interleave(bs, dim=1).repeat_interleave(bs, dim=2)
        dense = dense[:, : self.seqlen_q, : self.seqlen_k]
        if self.causal:
            dense = dense & causal_mask(self.seqlen_q, self.seqlen_k, dense.device)
        return dense

    def density(self) -> float:
        """Fraction of blocks kept (averaged over heads): the fraction of the dense kernel's work done."""
        return float(self.blocks.float().mean())

    def sparsity(self) -> float:
        return 1.0 - self.density()

    def with_causal(self) -> "BlockSparseLayout":
        return self & causal(self.seqlen_q, self.seqlen_k, self.block_size, device=self.blocks.device)

    # algebra ------------------------------------------------------------------------------------
    def _check_compatible(self, other: "BlockSparseLayout") -> None:
        if not isinstance(other, BlockSparseLayout):
            raise TypeError(f"can only combine a BlockSparseLayout with another, got {type(other).__name__}")
        mine = (self.block_size, self.seqlen_q, self.seqlen_k)
        theirs = (other.block_size, other.seqlen_q, other.seqlen_k)
        if mine != theirs:
            raise ValueError(f"layouts differ in (block_size, seqlen_q, seqlen_k): {mine} vs {theirs}")
        if self.nheads != other.nheads and 1 not in (self.nheads, other.nheads):
            raise ValueError(f"layouts have {self.nheads} and {other.nheads} heads; need equal or 1")

    def __and__(self, other: "BlockSparseLayout") -> "BlockSparseLayout":
        self._check_compatible(other)
        return BlockSparseLayout(self.blocks & other.blocks.to(self.blocks.device), self.block_size,
                                 self.seqlen_q, self.seqlen_k, self.causal or other.causal)

    def __or__(self, other: "BlockSparseLayout") -> "BlockSparseLayout":
        self._check_compatible(other)
        if self.causal != other.causal:
            # (A and causal) or B is not "blocks and causal" for any blocks: refuse rather than be wrong.
            raise ValueError("cannot take the union of a causal and a non-causal layout; "
                             "combine the patterns first, then apply causal")
        return BlockSparseLayout(self.blocks | other.blocks.to(self.blocks.device), self.block_size,
                                 self.seqlen_q, self.seqlen_k, self.causal)

    # picture ------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"BlockSparseLayout(heads={self.nheads}, blocks={self.nblocks_q}x{self.nblocks_k}, "
                f"block_size={self.block_size}, seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}, "
                f"causal={self.causal}, density={self.density():.4f})")

    def __str__(self, max_heads: int = 2, max_blocks: int = 64) -> str:
        """One character per block: '#' computed, '.' skipped, '\\' on the diagonal where causal cuts it."""
        lines = [repr(self)]
        for h in range(min(self.nheads, max_heads)):
            if self.nheads > 1:
                lines.append(f"head {h}:")
            grid = self.blocks[h].cpu()
            nq, nk = grid.shape
            off = self.seqlen_k - self.seqlen_q
            bs = self.block_size
            for i in range(min(nq, max_blocks)):
                row = []
                for j in range(min(nk, max_blocks)):
                    ch = "#" if grid[i, j] else "."
                    if grid[i, j] and self.causal:
                        last_q = min((i + 1) * bs, self.seqlen_q) - 1
                        if (j + 1) * bs - 1 > i * bs + off and j * bs <= last_q + off:
                            ch = "\\"  # on the diagonal: partly masked
                    row.append(ch)
                lines.append("".join(row) + (" ..." if nk > max_blocks else ""))
            if nq > max_blocks:
                lines.append("...")
        if self.nheads > max_heads:
            lines.append(f"... ({self.nheads - max_heads} more heads)")
        return "\n".join(lines)


# patterns ---------------------------------------------------------------------------------------
def _grid(seqlen_q: int, seqlen_k: int, block_size: int, device=None):
    nq, nk = cdiv(seqlen_q, block_size), cdiv(seqlen_k, block_size)
    i = torch.arange(nq, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return i, j


def _make(blocks, block_size, seqlen_q, seqlen_k, causal_flag=False) -> BlockSparseLayout:
    return BlockSparseLayout(blocks.unsqueeze(0) if blocks.dim() == 2 else blocks, block_size, seqlen_q,
                             seqlen_k, causal_flag)


def full(seqlen_q: int, seqlen_k: int, block_size: int = 128, device=None) -> BlockSparseLayout:
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    return _make((i >= 0) & (j >= 0), block_size, seqlen_q, seqlen_k)


def causal(seqlen_q: int, seqlen_k: int, block_size: int = 128, device=None) -> BlockSparseLayout:
    """Blocks holding at least one token pair with j <= i + seqlen_k - seqlen_q; the layout is causal."""
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    last_q = torch.clamp((i + 1) * block_size, max=seqlen_q) - 1
    blocks = j * block_size <= last_q + (seqlen_k - seqlen_q)
    return _make(blocks, block_size, seqlen_q, seqlen_k, causal_flag=True)


def local(seqlen_q: int, seqlen_k: int, block_size: int = 128, window: int = 1, device=None) -> BlockSparseLayout:
    """Sliding window: query block i sees key blocks j with |i - j| <= window."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    return _make((i - j).abs() <= window, block_size, seqlen_q, seqlen_k)


def global_local(seqlen_q: int, seqlen_k: int, block_size: int = 128, window: int = 1, n_global: int = 1,
                 device=None) -> BlockSparseLayout:
    """Longformer / BigBird style: the local window plus n_global leading blocks that see and are seen
    by every block."""
    if n_global < 0:
        raise ValueError(f"n_global must be >= 0, got {n_global}")
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    return _make(((i - j).abs() <= window) | (i < n_global) | (j < n_global), block_size, seqlen_q, seqlen_k)


def strided(seqlen_q: int, seqlen_k: int, block_size: int = 128, stride: int = 4, local: bool = True,
            device=None) -> BlockSparseLayout:
    """Sparse Transformer strided pattern on blocks: (i - j) % stride == 0, and with local=True also the
    band |i - j| < stride (the union of its two heads)."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    blocks = (i - j) % stride == 0
    if local:
        blocks = blocks | ((i - j).abs() < stride)
    return _make(blocks, block_size, seqlen_q, seqlen_k)


def butterfly(seqlen_q: int, seqlen_k: int, block_size: int = 128, n_factors: int | None = None,
              device=None) -> BlockSparseLayout:
    """Flat block butterfly: i XOR j in {0} or a power of two below 2**n_factors (default: all factors,
    ceil(log2(nblocks))). Density about (1 + log2 n) / n for n blocks."""
    i, j = _grid(seqlen_q, seqlen_k, block_size, device)
    if n_factors is None:
        n_factors = max(1, math.ceil(math.log2(max(i.shape[0], j.shape[1], 2))))
    x = i ^ j
    is_pow2 = (x & (x - 1)) == 0  # true for 0 and every power of two
    blocks = is_pow2 & (x < (1 << n_factors))
    return _make(blocks, block_size, seqlen_q, seqlen_k)


def random(seqlen_q: int, seqlen_k: int, block_size: int = 128, density: float = 0.25, nheads: int = 1,
           seed: int = 0, device=None) -> BlockSparseLayout:
    """Each block kept independently with probability `density`, drawn per head from `seed`."""
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density}")
    nq, nk = cdiv(seqlen_q, block_size), cdiv(seqlen_k, block_size)
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.rand(nheads, nq, nk, generator=gen) < density
    return _make(blocks.to(device) if device is not None else blocks, block_size, seqlen_q, seqlen_k)


PATTERNS = {
    "full": full,
    "causal": causal,
    "local": local,
    "global_local": global_local,
    "strided": strided,
    "butterfly": butterfly,
    "random": random,
}


def make_layout(pattern, seqlen_q: int, seqlen_k: int, block_size: int = 128, device=None,
                **kwargs) -> BlockSparseLayout:
    """Build a layout from a config: `pattern` a name from PATTERNS or a list of names (their union).

    Keyword arguments go to every pattern that takes them (e.g. window, n_global, stride, density,
    seed, nheads, n_factors); unknown ones raise.
    """
    import inspect

    names = [pattern] if isinstance(pattern, str) else list(pattern)
    if not names:
        raise ValueError("pattern list is empty")
    used = set()
    layout = None
    for name in names:
        if name not in PATTERNS:
            raise ValueError(f"unknown block-sparse pattern {name!r}; choose from {sorted(PATTERNS)}")
        if name == "causal":
            continue  # applied last, to the union of the others
        fn = PATTERNS[name]
        params = inspect.signature(fn).parameters
        mine = {k: v for k, v in kwargs.items() if k in params}
        used |= set(mine)
        one = fn(seqlen_q, seqlen_k, block_size, device=device, **mine)
        layout = one if layout is None else layout | one
    if "causal" in names:
        c = causal(seqlen_q, seqlen_k, block_size, device=device)
        layout = c if layout is None else layout & c
    unknown = set(kwargs) - used
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)} for pattern(s) {names}")
    return layout
