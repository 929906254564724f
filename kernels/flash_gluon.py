"""Attention for Hopper written in Gluon: FlashAttention-3's warp-specialised forward and backward.

Gluon (`triton.experimental.gluon`, shipped with Triton 3.6) makes shared-memory buffers, mbarriers, TMA copies,
asynchronous wgmma and warp specialisation explicit. FlashAttention-3's structure (Shah et al., 2024, section 3.1)
can be written in it but not in `@triton.jit`. The forward:

    a work item = 128 query rows of one (batch, head); a program runs one or many (`_work_unit`); three partitions:
    loader (1 warp, 24 registers)   per item Q's two 64-row halves by TMA into one of Q_BUFFERS buffers, then K(j),
                                    V(j) into a STAGES-deep ring that runs on across items; a slot is refilled once
                                    both consumers have released it (count-2 mbarrier); at head dim 256, whose ring
                                    has two slots, K is released after S and loaded ahead of V (FWD_K_AHEAD)
    consumer w = 0, 1 (4 warps each) 64 query rows: S(j) = Q K(j)^T and O += P(j-1) V(j-1) as async wgmma,
                                    issued in turn with the other consumer (two mbarriers): one warpgroup's softmax
                                    runs while the other's matmuls do

Persistent (`fwd_persistent`): one program a SM (132 on an H100) runs units pid, pid + 132, ..., so one item's
start (Q's load, the first S) and end (the last P V, O's store) overlap the next item's loads instead of leaving
the SM to the block scheduler. Under a causal mask a unit is a pair of query tiles whose work adds up to one full
row (`_work_unit`). The barrier protocol across items is simulated on the CPU
(results/attention/gluon_persistent/protocol_sim.py).

ptxas places the wait for P V before the softmax's exponentials whatever the source order, so the overlap inside one
warpgroup that FlashAttention-3's paper also describes does not survive; the overlap between the two warpgroups
does (results/attention/gluon_fwd/README.md). Measured on one H100 against the `@triton.jit` forward: 1.07-1.21x
at head dim 128 from 1K tokens (results/attention/gluon_fwd/bench_h100.txt), 1.2-1.9x at 256 from 512
(short_h100.txt, bench_h100_hd256.txt), 1.03-1.12x at 64 from 2K non-causal and 4K causal
(results/attention/launch_direct/hd64_fwd_h100.txt); the persistent grid adds to these (PERSISTENT_CAUSAL_UP_TO's
comment). The backward (`_bwd_kernel` and, at head dim 64, `_bwd_split_kernel`, below) has its own account.

Both take TMA descriptors built on the host (`head_tiles`, passed by value as __grid_constant__ parameters) rather
than building their own in every program: 1.1-1.3x at 1K-2K tokens, 1.0-1.07x from 4K
(results/attention/gluon_hostdesc/). Both launch through kernels/launch.py's direct path, which keys the descriptors
by block shape and layout, so a repeated call does not go through JITFunction.run (results/attention/launch_direct/).

Scope, checked by `unsupported` / `bwd_unsupported` (kernels/flash.py runs its `@triton.jit` kernels everywhere
else): an sm_90 GPU, fp16/bf16, no dropout (but at head dim 64 from FWD_DROPOUT_MIN_SEQLEN /
BWD_DROPOUT_MIN_SEQLEN), no varlen, seqlen_q == seqlen_k, a multiple of 128 (the 2-D TMA view
runs one batch's rows into the next one's, so the tiles must not cross it) and at least MIN_SEQLEN /
BWD_MIN_SEQLEN; the forward at head dims 64, 128 and 256, with grouped-query attention, the backward at 64, 128 and
256 without it.
Any row stride that TMA can read is supported (q, k, v as views of a packed qkv; dq, dk, dv of a packed dqkv). The
output and the base-2 log-sum-exp are the ones `kernels.flash._fwd_kernel` writes, so either backward takes them.
"""
from __future__ import annotations

import functools

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language import _core
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.flash import LOG2E, _drop_consts, scale_cast
from kernels.gluon_dropout import acc_layout as _acc_layout, keep_rows
from kernels.launch import Prepared

# (BLOCK_M, BLOCK_N, STAGES, Q_BUFFERS) per head dim: at 128 the fastest of the prototype's tiles at every benchmarked
# point; at 256 the ones that fit shared memory (197 KB) without spills (1.18-1.43x the @triton.jit forward,
# 1.15-1.62x FlashAttention-2's on the H100: results/attention/gluon_fwd/bench_h100_hd256.txt); at 64 the best causal
# ones of three (results/attention/launch_direct/hd64_fwd_h100.txt). Q_BUFFERS = 2 lets a persistent program load its
# next item's Q while it computes this one; at 128 and 256 the second buffer does not fit beside a 3-stage / 2-stage
# ring (at 128, 2 stages with 2 buffers were 0.50-0.91x: results/attention/gluon_persistent/bench_h100_s34a.txt).
FWD_TILES = {64: (128, 128, 3, 2), 128: (128, 128, 3, 1), 256: (128, 64, 2, 1)}
# The persistent grid (one program a SM, each running many work units, `_work_unit`) against one tile a program, the
# forward alone on one H100, 16K tokens a batch, three runs (results/attention/gluon_persistent/README.md): head dim
# 64 non-causal 1.41x at 512, 1.19-1.21x at 1K, 1.09-1.11x at 2K, 1.04-1.06x at 4K, 0.96-1.05x from 8K; causal
# (pairs) 1.05-1.15x at 1K-4K, 0.99-1.01x at 8K, 0.97-0.98x at 16K; head dim 128 non-causal 1.00-1.09x at every
# length, causal 1.03-1.13x at 1K-8K and 0.98-1.01x at 16K; head dim 256 0.99-1.02x non-causal, 0.93-1.01x causal.
# So it runs up to 8K tokens causal, at every length non-causal, and not at head dim 256.
PERSISTENT_CAUSAL_UP_TO = 8192
PERSISTENT_HEAD_DIMS = (64, 128)
# (head dim, causal) where the consumers' turns order their exponentials rather than their wgmma issues (`_consumer`'s
# EXP_TURNS). The forward alone on one H100, 5 alternating rounds (results/attention/gluon_fwd_turns/bench_h100.txt):
# head dim 64 non-causal 1.03-1.08x at 1K-16K, at or above cuDNN's forward there; causal 0.95-0.97x; head dim 128
# 0.99-1.04x non-causal, 0.96-0.98x causal up to 8K. So only head dim 64 non-causal.
FWD_EXP_TURNS = {(64, False)}
# (head dim, causal) whose key tiles run in descending order (`_consumer`'s KEYS_DOWN), the causal masked tile first
# (FlashAttention-3's order), so that the other rounds are unmasked at compile time. Needs BLOCK_N == BLOCK_M. The
# forward alone on one H100 against ascending keys (results/attention/gluon_fwd_turns/bench_peeled_h100.txt), head dim
# 64 causal: 1.12x at 1K, 1.02-1.04x at 2K-16K, 0.99-1.03x cuDNN's forward from 2K in the same rounds; head dim 128
# causal 0.95-1.00x.
FWD_KEYS_DOWN = {(64, True)}
# (head dim, causal) whose consumers pass their turns through two hardware named barriers rather than two mbarriers
# (`_consumer`'s NAMED_TURNS): an mbarrier arrive from a warpgroup is a warpgroup-wide bar.sync and one elected
# thread's arrive, a bar.arrive blocks no one. The forward alone on one H100 against mbarrier turns, two runs of 5 and 9
# alternating rounds (results/attention/gluon_fwd_named/bench_h100.txt, bench2_h100.txt): head dim 128 1.000-1.018x
# at all 14 points (1K-16K, either mask); head dim 64 non-causal 0.97-0.98x, causal 0.99-1.01x.
FWD_NAMED_TURNS = {(128, False), (128, True)}
# (head dim, causal) whose diagonal tile's mask tests the tile's own column index (`_softmax_step`'s MASK_REL), with
# fewer integer instructions (static SASS at head dim 64 causal 4296 -> 4032). Same runs: head dim 64 causal
# 1.006-1.028x at 1K-16K in the first, 0.999-1.017x at 2K-16K in the second; head dim 128 causal, whose key loop
# carries the masked branch, 0.974-0.977x at 16K in both.
FWD_MASK_REL = {(64, True)}

# Shortest sequences the forward takes with dropout, per (head dim, causal): kernels/gluon_dropout.py's mask, drawn in
# the scores' registers, puts its Philox rounds on each consumer's softmax, which the other consumer's matmuls no
# longer hide. Against the autotuned @triton.jit forward with dropout 0.1 on one H100
# (results/attention/gluon_fwd_dropout/ab_h100.jsonl): head dim 64 non-causal 1.05x at 1K, 1.07x at 4K; causal
# 0.82-0.85x at 1K (GPT-2's shape included), 0.97x at 2K, 1.04x at 4K. At head dim 128 the Philox rounds beside the
# 64-column O made the consumers spill (16 bytes non-causal, 136 causal, sm_90 compile), so it is not taken there.
# Drawn instead by a fourth partition into shared memory, the masks ran at 0.61-0.77x this form
# (results/attention/gluon_fwd_masker/): by count, a 128 x 128 tile's Philox rounds take about as many SM cycles
# (IMAD at half rate) as its two matmuls, and one warp a scheduler could not issue them fast enough.
FWD_DROPOUT_MIN_SEQLEN = {(64, False): 1024, (64, True): 4096}


# (head dim, causal) whose K slots are released once both consumers' S is done with them (`_consumer`'s K_AHEAD), so
# the loader refills them a round earlier. ncu of head dim 256's forward at 4K (results/attention/hd256_profile/)
# put ~24% of the consumers' stall samples on the wait for K to arrive: with STAGES = 2 and K released after the
# round's P V, K(j) could only be loaded at the end of round j - 1. The forward alone on one H100, 5 alternating rounds
# (results/attention/gluon_fwd_k_ahead/bench_h100.txt): head dim 256 1.27-1.42x at 1K-16K, either mask, from
# 0.75-0.83x cuDNN's forward to 0.95-1.11x; head dim 128 (3 stages) 0.98-1.01x, head dim 64 non-causal 0.97-1.00x,
# causal 1.00-1.02x. So only head dim 256.
FWD_K_AHEAD = {(256, False), (256, True)}


def fwd_forms(head_dim: int, causal: bool) -> dict:
    """The forward kernel's form constexprs at (head dim, causal), from the five sets above."""
    return dict(EXP_TURNS=(head_dim, causal) in FWD_EXP_TURNS, KEYS_DOWN=(head_dim, causal) in FWD_KEYS_DOWN,
                NAMED_TURNS=(head_dim, causal) in FWD_NAMED_TURNS, MASK_REL=(head_dim, causal) in FWD_MASK_REL,
                K_AHEAD=(head_dim, causal) in FWD_K_AHEAD)


def fwd_persistent(head_dim: int, seqlen: int, causal: bool) -> bool:
    """Whether the forward runs a persistent grid at this shape (see PERSISTENT_CAUSAL_UP_TO)."""
    return head_dim in PERSISTENT_HEAD_DIMS and not (causal and seqlen > PERSISTENT_CAUSAL_UP_TO)


# Heads per launch group (`_work_item`): 8 under a causal mask up to 8K tokens, else 1. Two sweeps of groups 1-16
# on one H100 (results/attention/head_order/): causal, head dim 128, group 8 against 1: backward 1.01-1.06x and forward
# 0.98-1.04x at 1K-8K; at 16K-32K 0.95-1.01x; non-causal, where every program does the same work, 0.93-0.99x.
CAUSAL_HEAD_GROUP, CAUSAL_GROUP_UP_TO = 8, 8192


def launch_head_group(seqlen: int, causal: bool) -> int:
    return CAUSAL_HEAD_GROUP if causal and seqlen <= CAUSAL_GROUP_UP_TO else 1


CONSUMER_REGS = 240  # setmaxnreg for the consumers; the loader gets 24
# Shortest sequences it takes, per (head dim, causal). With every launch on kernels/launch.py's direct path
# (results/attention/launch_direct/short_h100.txt), head dim 128: 1.29x the @triton.jit forward at 1K (either), 1.08x
# at 512 causal and 1.25x at 512 non-causal alone, but in the autograd forward+backward at 512 non-causal 0.80x: there
# the Gluon path's host time (897 us a call, against 681 for the @triton.jit path's) outran its kernels' ~0.76 ms, so
# 512 stays with the @triton.jit kernels; head dim 256: 1.43-1.51x at 512. Head dim 64, with the persistent grid
# (results/attention/gluon_persistent/bench_h100_s34*.txt), against the autotuned @triton.jit forward: 1.17x at 1K
# non-causal (1.25x at 512, kept out for the host-time reason above); causal 1.00-1.07x at 1K, 1.04-1.07x at 2K
# (0.76x at 512), so causal started at 2K. With FWD_KEYS_DOWN (results/attention/gluon_fwd_turns/min_seqlen_h100.txt)
# causal at 1K: forward 1.07x (32 heads) and 1.10x (GPT-2's 12), autograd forward+backward 1.016x / 1.021x replayed
# from CUDA graphs; at 512 forward 0.95x. So causal starts at 1K.
MIN_SEQLEN = {(64, False): 1024, (64, True): 1024, (128, False): 1024, (128, True): 1024, (256, False): 512,
              (256, True): 512}


@gluon.constexpr_function
def _lhs_layout(warps, n):
    """The register operand (P) of a wgmma whose accumulator has _acc_layout(warps, n)."""
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(warps, n), k_width=2)


@gluon.constexpr_function
def _named_barrier_asm(op, barrier):
    return f"{op} {barrier}, 256; mov.b32 $0, 0;"


@gluon.jit
def _named_barrier(ID: gl.constexpr, SYNC: gl.constexpr):
    """bar.sync (SYNC) or bar.arrive on hardware barrier 14 + ID for 256 threads: the two consumer warpgroups, one
    waiting, the other passing (NAMED_TURNS). One element a thread, so the asm runs once a
    thread; not pure, so it stays where it is."""
    one = gl.full([128], 0, gl.int32, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.inline_asm_elementwise(_named_barrier_asm("bar.sync" if SYNC else "bar.arrive", 14 + ID), "=r,r", [one],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _turn_wait(my_turn, phase, W: gl.constexpr, NAMED: gl.constexpr):
    """Wait for consumer W's turn: its mbarrier's phase `phase`, or with NAMED its hardware barrier."""
    if NAMED:
        _named_barrier(W, True)
    else:
        mbarrier.wait(my_turn, phase)


@gluon.jit
def _turn_pass(other_turn, W: gl.constexpr, NAMED: gl.constexpr):
    """Pass the turn to the other consumer. An mbarrier arrive from a warpgroup is one elected thread's after a
    warpgroup-wide bar.sync; a hardware barrier's bar.arrive blocks no one."""
    if NAMED:
        _named_barrier(1 - W, False)
    else:
        mbarrier.arrive(other_turn)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, MASK: gl.constexpr, s_layout: gl.constexpr, my_turn=None,
                  other_turn=None, phase=0, EXP_TURNS: gl.constexpr = False, W: gl.constexpr = 0,
                  NAMED: gl.constexpr = False, MASK_REL: gl.constexpr = False):
    """Online softmax of one float32 score tile: (P unnormalised, new row max, new row sum, alpha), base 2. With
    EXP_TURNS the exponentials run in this consumer's turn (my_turn's phase `phase`, or with NAMED consumer W's
    hardware barrier), which it then passes on. MASK_REL: see `_consumer`."""
    if MASK:  # the tile crosses the diagonal: key j is visible to query i iff j <= i
        if MASK_REL:  # the same test against the tile's own column index (FWD_MASK_REL): fewer integer instructions
            cols = gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
            s = gl.where(cols[None, :] <= (rows - start_n)[:, None], s, float("-inf"))
        else:
            cols = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
            s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    if EXP_TURNS:
        _turn_wait(my_turn, phase, W, NAMED)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    if EXP_TURNS:
        _turn_pass(other_turn, W, NAMED)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, start_n, rows, crosses_diagonal, IS_CAUSAL: gl.constexpr,
                  s_layout: gl.constexpr, my_turn=None, other_turn=None, phase=0, EXP_TURNS: gl.constexpr = False,
                  W: gl.constexpr = 0, NAMED: gl.constexpr = False, MASK_REL: gl.constexpr = False):
    """_softmax_step with the causal mask only on tiles that cross the diagonal (a runtime test)."""
    if IS_CAUSAL:
        if crosses_diagonal:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, True, s_layout, my_turn,
                                               other_turn, phase, EXP_TURNS, W, NAMED, MASK_REL)
        else:
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, False, s_layout, my_turn,
                                               other_turn, phase, EXP_TURNS, W, NAMED)
    else:
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale, start_n, rows, False, s_layout, my_turn, other_turn,
                                           phase, EXP_TURNS, W, NAMED)
    return p, m_i, l_i, alpha


@gluon.jit
def _work_item(t, n_tiles, n_bh, head_group):
    """(tile, batch x head) of item t of n_tiles x n_bh, in groups of head_group heads, tile by tile within a group:
    1 runs one head's tiles back to back (its K and V, or Q and dO, shared in L2 by the programs in flight); more
    heads per group run the tiles of equal work of several heads together, so under a causal mask the longest
    programs do not trail in the last wave."""
    per_group = head_group * n_tiles
    first = (t // per_group) * head_group
    r = t % per_group
    here = gl.minimum(n_bh - first, head_group)  # the last group may have fewer
    return r // here, first + r % here


@gluon.jit
def _n_units(n_tiles, n_bh, PAIRED: gl.constexpr):
    """Work units of n_tiles tiles x n_bh heads (`_work_unit`)."""
    if PAIRED:
        return (n_tiles + 1) // 2 * n_bh
    else:
        return n_tiles * n_bh


@gluon.jit
def _work_unit(u, n_tiles, n_bh, head_group, PAIRED: gl.constexpr, REVERSE: gl.constexpr):
    """Work unit u of n_tiles tiles (query tiles for the forward, key blocks for the backward) x n_bh heads:
    (batch x head, its first tile, its second, how many of the two it has). REVERSE counts tiles from the end (the
    forward under a mask, where the last query tiles are the longest).

    PAIRED (causal, persistent): tiles i and n_tiles-1-i of one head, the longer first. Each pair has the same work
    (one unmasked row of tiles plus one diagonal tile; the middle tile of an odd count is a unit alone), so the
    persistent grid's fixed round-robin of units is as balanced as a non-causal one. Units run head by head, so the
    programs in flight share a few heads' K and V (or Q and dO) in L2. Round-robin over single causal tiles was
    0.72-0.73x the one-program-a-tile forward at head dim 128 (results/attention/gluon_persistent/), where the
    hardware gives the next program to whichever SM frees first. Otherwise one tile, in `_work_item`'s order."""
    if PAIRED:
        per_head = (n_tiles + 1) // 2
        bh = u // per_head
        i = u % per_head
        first = i
        second = n_tiles - 1 - i
        count = 2 - (2 * i + 1 == n_tiles).to(gl.int32)
    else:
        first, bh = _work_item(u, n_tiles, n_bh, head_group)
        second = first
        count = 1
    if REVERSE:
        first = n_tiles - 1 - first
        second = n_tiles - 1 - second
    return bh, first, second, count


@gluon.jit
def _fwd_item(bh, pid_m, nheads, group, seqlen, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
              IS_CAUSAL: gl.constexpr):
    """Query tile pid_m of (batch x head) bh: (start_m, key tiles, key tiles without a mask, Q's first row, K's and
    V's first row, Q's column, K's and V's column)."""
    b = bh // nheads
    h = bh % nheads
    start_m = pid_m * BLOCK_M
    if IS_CAUSAL:
        n_tiles = gl.cdiv(start_m + BLOCK_M, BLOCK_N)
        n_full = (start_m + 1) // BLOCK_N  # tiles whose last key every row of this tile sees: no mask
    else:
        n_tiles = seqlen // BLOCK_N
        n_full = n_tiles
    kv_row0 = b * seqlen
    return start_m, n_tiles, n_full, kv_row0 + start_m, kv_row0, h * HEAD_DIM, (h // group) * HEAD_DIM


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, k_empty,
            n_m, n_bh, nheads, group, seqlen, head_group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, Q_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr,
            PAIRED: gl.constexpr, KEYS_DOWN: gl.constexpr = False, K_AHEAD: gl.constexpr = False):
    """Per item: Q's two halves into Q buffer it % Q_BUFFERS once its last item's O has left it, then the item's
    K and V tiles into the ring, which runs on from item to item. K_AHEAD (`_consumer`): a K slot waits on k_empty
    (both consumers' S done with it), a V slot on kv_empty, and K(j) is loaded before V(j - 1)."""
    SUB_M: gl.constexpr = BLOCK_M // 2
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    Q_BYTES: gl.constexpr = SUB_M * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    it = 0  # items done by this program
    g = 0  # K/V tiles loaded so far, over all items: the ring's position
    for u in range(gl.program_id(0), _n_units(n_m, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_m, n_bh, head_group, PAIRED, IS_CAUSAL)
        for half in range(count):
            start_m, n_tiles, n_full, q_row0, kv_row0, q_col, kv_col = _fwd_item(
                bh, gl.where(half == 0, first, second), nheads, group, seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            qb = it % Q_BUFFERS
            for w in gl.static_range(2):
                # a fresh barrier passes parity 1 at once
                mbarrier.wait(q_empty.index(2 * qb + w), ((it // Q_BUFFERS) & 1) ^ 1)
                mbarrier.expect(q_ready.index(2 * qb + w), Q_BYTES)
                tma.async_copy_global_to_shared(q_desc, [q_row0 + w * SUB_M, q_col], q_ready.index(2 * qb + w),
                                                q_smem.index(2 * qb + w))
            for j in range(n_tiles):
                slot = g % STAGES
                kt = n_tiles - 1 - j if KEYS_DOWN else j  # the key tile this round reads
                if K_AHEAD:
                    _ring_load(k_desc, kv_row0 + kt * BLOCK_N, kv_col, k_empty, k_ready, k_smem, g, STAGES, KV_BYTES)
                    if j > 0:  # V(j - 1), behind K(j)
                        _ring_load(v_desc, kv_row0 + (kt + 1 if KEYS_DOWN else kt - 1) * BLOCK_N, kv_col, kv_empty,
                                   v_ready, v_smem, g - 1, STAGES, KV_BYTES)
                else:
                    mbarrier.wait(kv_empty.index(slot), ((g // STAGES) & 1) ^ 1)
                    mbarrier.expect(k_ready.index(slot), KV_BYTES)
                    tma.async_copy_global_to_shared(k_desc, [kv_row0 + kt * BLOCK_N, kv_col], k_ready.index(slot),
                                                    k_smem.index(slot))
                    mbarrier.expect(v_ready.index(slot), KV_BYTES)
                    tma.async_copy_global_to_shared(v_desc, [kv_row0 + kt * BLOCK_N, kv_col], v_ready.index(slot),
                                                    v_smem.index(slot))
                g += 1
            if K_AHEAD:  # the item's last V
                kt_last = 0 if KEYS_DOWN else n_tiles - 1
                _ring_load(v_desc, kv_row0 + kt_last * BLOCK_N, kv_col, kv_empty, v_ready, v_smem, g - 1, STAGES,
                           KV_BYTES)
            it += 1


@gluon.jit
def _ring_load(desc, row, col, empty, ready, smem, g, STAGES: gl.constexpr, BYTES: gl.constexpr):
    """Tile (row, col) of desc into ring slot g % STAGES once its consumers have released it (a fresh barrier
    passes parity 1 at once)."""
    slot = g % STAGES
    mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(slot), BYTES)
    tma.async_copy_global_to_shared(desc, [row, col], ready.index(slot), smem.index(slot))


@gluon.jit
def _consumer(W: gl.constexpr, o_desc, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
              k_empty, turns, n_m, n_bh, nheads, group, seqlen, head_group, qk_scale, SEED, drop_thresh, drop_scale,
              BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, Q_BUFFERS: gl.constexpr,
              IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, EXP_TURNS: gl.constexpr = False,
              KEYS_DOWN: gl.constexpr = False, NAMED_TURNS: gl.constexpr = False, MASK_REL: gl.constexpr = False,
              HAS_DROPOUT: gl.constexpr = False, K_AHEAD: gl.constexpr = False):
    """Query rows start_m + W * 64 .. +63 of every item of this program: per key tile j, S(j) and P(j-1) V(j-1)
    issued in this consumer's turn, then the softmax of S(j) while the other consumer issues. Ring slots, turns and
    Q buffers are counted across items, so the next item's first S follows this one's epilogue at once.
    EXP_TURNS (FWD_EXP_TURNS): the turns order the softmax's exponentials instead of the wgmma issues, so that the
    two consumers' exponentials never share the SM's exp units (cuDNN's order, read from its SASS). KEYS_DOWN
    (FWD_KEYS_DOWN): the key tiles in descending order, so that a causal item's one masked tile is its round 0 and the
    loop's rounds are unmasked at compile time (FlashAttention-3's order). NAMED_TURNS (FWD_NAMED_TURNS): the turns
    through hardware named barriers instead of mbarriers. MASK_REL (FWD_MASK_REL): the diagonal tile's mask against the
    tile's own column index. K_AHEAD (FWD_K_AHEAD): K's slot is released (k_empty) as soon as this consumer's S is
    done with it, not after the round's P V, so the loader refills it a round earlier. HAS_DROPOUT: P's dropped
    scores are left out of O but kept in the row sums, as kernels.flash's forward does, with its mask
    (kernels/gluon_dropout.py), and O is scaled by drop_scale."""
    SUB_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_smem.dtype
    # with KEYS_DOWN (BLOCK_N == BLOCK_M) an item's one masked tile is its round 0, so rounds 1 .. n-1 are unmasked at
    # compile time: no runtime branch around their softmax, which ptxas does not schedule across (1.02-1.05x the
    # branching form at head dim 64 causal: results/attention/gluon_fwd_turns/bench_peel_h100.txt)
    LOOP_MAY_MASK: gl.constexpr = IS_CAUSAL and not KEYS_DOWN
    s_layout: gl.constexpr = _acc_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = _lhs_layout(4, HEAD_DIM)
    my_turn = turns.index(W)
    other_turn = turns.index(1 - W)
    s_init = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
    it = 0
    g = 0  # the ring position of this item's first K/V tile
    tc = 0  # waits on my_turn so far: its parity is the phase to wait for
    if HAS_DROPOUT:
        seed = gl.load(SEED)
    else:
        seed = 0
    if NAMED_TURNS:
        if W == 1:
            _named_barrier(0, False)  # consumer 0 goes first
    for u in range(gl.program_id(0), _n_units(n_m, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_m, n_bh, head_group, PAIRED, IS_CAUSAL)
        for half in range(count):
            start_m, n_tiles, n_full, q_row0, kv_row0, q_col, kv_col = _fwd_item(
                bh, gl.where(half == 0, first, second), nheads, group, seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            qi = 2 * (it % Q_BUFFERS) + W
            my_q = q_smem.index(qi)
            rows = start_m + W * SUB_M + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, s_layout))
            m_i = gl.full([SUB_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([SUB_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([SUB_M, HEAD_DIM], gl.float32, layout=o_layout)
            mbarrier.wait(q_ready.index(qi), (it // Q_BUFFERS) & 1)

            # round 0: S(0) alone
            slot = g % STAGES
            mbarrier.wait(k_ready.index(slot), (g // STAGES) & 1)
            if not EXP_TURNS:
                _turn_wait(my_turn, tc & 1, W, NAMED_TURNS)
                tc += 1
            s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
            if not EXP_TURNS:
                _turn_pass(other_turn, W, NAMED_TURNS)
            s = warpgroup_mma_wait(0, (s_tok,))
            if K_AHEAD:
                mbarrier.arrive(k_empty.index(slot))
            kt0 = n_tiles - 1 if KEYS_DOWN else 0
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, kt0 * BLOCK_N, rows, kt0 >= n_full, IS_CAUSAL,
                                               s_layout, my_turn, other_turn, tc & 1, EXP_TURNS, W,
                                               NAMED_TURNS, MASK_REL)
            if EXP_TURNS:
                tc += 1
            if HAS_DROPOUT:
                p = gl.where(keep_rows(seed, bh, start_m + W * SUB_M, kt0 * BLOCK_N, drop_thresh, s_layout, SUB_M,
                                       BLOCK_N, 4), p, 0.0)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

            # rounds 1 .. n-1: S(j) and P(j-1) V(j-1)
            for j in range(1, n_tiles):
                gj = g + j
                slot = gj % STAGES
                prev = (gj - 1) % STAGES
                mbarrier.wait(k_ready.index(slot), (gj // STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((gj - 1) // STAGES) & 1)
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                if not EXP_TURNS:
                    _turn_wait(my_turn, tc & 1, W, NAMED_TURNS)
                    tc += 1
                s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
                acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                if not EXP_TURNS:
                    _turn_pass(other_turn, W, NAMED_TURNS)
                s = warpgroup_mma_wait(1, (s_tok,))  # S(j) was issued first, so it is the one done
                if K_AHEAD:
                    mbarrier.arrive(k_empty.index(slot))
                kt = n_tiles - 1 - j if KEYS_DOWN else j
                p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, kt * BLOCK_N, rows, kt >= n_full,
                                                   LOOP_MAY_MASK, s_layout, my_turn, other_turn, tc & 1, EXP_TURNS, W,
                                                   NAMED_TURNS, MASK_REL)
                if EXP_TURNS:
                    tc += 1
                if HAS_DROPOUT:  # drawn while P(j-1) V(j-1) runs
                    p = gl.where(keep_rows(seed, bh, start_m + W * SUB_M, kt * BLOCK_N, drop_thresh, s_layout, SUB_M,
                                           BLOCK_N, 4), p, 0.0)
                acc = warpgroup_mma_wait(0, (acc_tok,))
                mbarrier.arrive(kv_empty.index(prev))  # this consumer is done with tile j-1's V (and K)
                p_op = gl.convert_layout(p.to(dtype), p_layout)

            # round n: P(n-1) V(n-1)
            glast = g + n_tiles - 1
            last = glast % STAGES
            mbarrier.wait(v_ready.index(last), (glast // STAGES) & 1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            if not EXP_TURNS:
                _turn_wait(my_turn, tc & 1, W, NAMED_TURNS)
                tc += 1
            acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
            if not EXP_TURNS:
                _turn_pass(other_turn, W, NAMED_TURNS)
            acc = warpgroup_mma_wait(0, (acc_tok,))
            mbarrier.arrive(kv_empty.index(last))

            if HAS_DROPOUT:
                acc = acc * gl.convert_layout(drop_scale / l_i, gl.SliceLayout(1, o_layout))[:, None]
            else:
                acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
            my_q.store(acc.to(dtype))  # this Q buffer is no longer read: it takes O on the way out
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [q_row0 + W * SUB_M, q_col], my_q)
            gl.store(LSE + bh.to(gl.int64) * seqlen + rows, m_i + gl.log2(l_i))
            tma.store_wait(0)  # O has left the buffer: the loader may put item it + Q_BUFFERS's Q there
            mbarrier.arrive(q_empty.index(qi))
            g += n_tiles
            it += 1


@gluon.jit
def _fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, SEED, seqlen, nheads, n_bh, group, qk_scale, head_group,
                drop_thresh, drop_scale,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                Q_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                EXP_TURNS: gl.constexpr = False, KEYS_DOWN: gl.constexpr = False, NAMED_TURNS: gl.constexpr = False,
                MASK_REL: gl.constexpr = False, HAS_DROPOUT: gl.constexpr = False, K_AHEAD: gl.constexpr = False):
    # q_desc, o_desc: tiles of BLOCK_M // 2 query rows, k_desc, v_desc of BLOCK_N keys (`head_tiles`). Each program
    # runs work units pid, pid + programs, ... (`_work_unit`): one a program on a grid of every unit, or many on a
    # persistent grid of one program a SM. SEED: the dropout seed (any pointer without dropout), beside LSE because
    # kernels/launch.py's direct path keys only tensors and descriptors followed by numbers
    dtype: gl.constexpr = q_desc.dtype
    SUB_M: gl.constexpr = BLOCK_M // 2
    n_m = seqlen // BLOCK_M
    q_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFFERS, SUB_M, HEAD_DIM], q_desc.layout)  # [buffer x consumer]
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if K_AHEAD:
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    else:  # not used: K goes back with V (kv_empty)
        k_empty = kv_empty
    for i in gl.static_range(2 * Q_BUFFERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot
        if K_AHEAD:
            mbarrier.init(k_empty.index(i), count=2)
    # descending, a tile narrower than the query tile could be all masked for a consumer's rows on its first round:
    # a row max of -inf, and NaN after it
    gl.static_assert(not KEYS_DOWN or BLOCK_N == BLOCK_M, "KEYS_DOWN needs BLOCK_N == BLOCK_M")
    mbarrier.arrive(turns.index(0))  # consumer 0 issues first
    fence_async_shared()
    # the argument tuples are written out in the call: a tuple first bound to a name turns its constexprs into
    # tensors on the way into the partitions. Each consumer's index goes in as a constexpr, one `_consumer` per index
    gl.warp_specialize([
        (_consumer, (gl.constexpr(0), o_desc, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                      k_empty, turns, n_m, n_bh, nheads, group, seqlen, head_group, qk_scale, SEED, drop_thresh,
                      drop_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, Q_BUFFERS, IS_CAUSAL, PAIRED, EXP_TURNS,
                      KEYS_DOWN, NAMED_TURNS, MASK_REL, HAS_DROPOUT, K_AHEAD)),
        (_consumer, (gl.constexpr(1), o_desc, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                      k_empty, turns, n_m, n_bh, nheads, group, seqlen, head_group, qk_scale, SEED, drop_thresh,
                      drop_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, Q_BUFFERS, IS_CAUSAL, PAIRED, EXP_TURNS,
                      KEYS_DOWN, NAMED_TURNS, MASK_REL, HAS_DROPOUT, K_AHEAD)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                   k_empty, n_m, n_bh, nheads, group, seqlen, head_group, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                   Q_BUFFERS, IS_CAUSAL, PAIRED, KEYS_DOWN, K_AHEAD))],
        [4, 1], [CONSUMER_REGS, 24])


_GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def _scope_problem(q, k, causal: bool, dropout_p: float, varlen: bool, min_seqlen: int,
                   dropout_min_seqlen: dict) -> str | None:
    """What both kernels need of self-attention inputs beyond the head dim, or None: dense fp16/bf16, seqlen_q ==
    seqlen_k a multiple of 128 (every tile divides it), at least min_seqlen, and with dropout at least
    dropout_min_seqlen[head dim, causal] (FWD_ / BWD_DROPOUT_MIN_SEQLEN; no entry: no dropout)."""
    seqlen = q.shape[1]
    if varlen:
        return "varlen"
    if dropout_p > 0:
        key = (q.shape[-1], causal)
        if key not in dropout_min_seqlen:
            return f"dropout at head dim {key[0]}{' causal' if causal else ''}"
        min_seqlen = max(min_seqlen, dropout_min_seqlen[key])
    if q.dtype not in _GL_DTYPES:
        return f"{q.dtype}"
    if seqlen != k.shape[1]:
        return "seqlen_q != seqlen_k"
    if seqlen % 128:
        return f"seqlen {seqlen} is not a multiple of 128"
    if seqlen < min_seqlen:
        return f"seqlen {seqlen} below {min_seqlen}{' causal' if causal else ''}, where it is slower"
    return None


def unsupported(q, k, v, causal: bool, dropout_p: float, varlen: bool) -> str | None:
    """Why this forward cannot take these inputs (beyond kernels.flash's platform and layout checks), or None."""
    head_dim = q.shape[-1]
    if head_dim not in FWD_TILES:
        return f"head dim {head_dim}, not one of {sorted(FWD_TILES)}"
    return _scope_problem(q, k, causal, dropout_p, varlen, MIN_SEQLEN[head_dim, causal], FWD_DROPOUT_MIN_SEQLEN)


def _dropout_args(who: str, dropout_p: float, seed) -> tuple:
    """(the 16-bit threshold, 1 / (1 - p)) of a launch, with dropout's seed checked. Without dropout the launch's
    SEED argument is any tensor (its callers pass lse), since kernels/launch.py's direct path keys a pointer there."""
    if dropout_p > 0 and (seed is None or seed.dtype != torch.int64 or seed.numel() != 1):
        raise ValueError(f"{who}: dropout needs its seed, one int64 (kernels.flash.draw_dropout_seed)")
    return _drop_consts(dropout_p)


@functools.lru_cache(maxsize=None)
def _shared_layout(rows: int, cols: int, dtype):
    """NVMMASharedLayout.get_default_for([rows, cols], dtype), kept: it costs ~5 us of host time a call, and every
    launch needs two to four."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


class HeadTiles:
    """Host TMA descriptors over tensors of one geometry (batch, seqlen, nheads, head_dim), heads side by side and rows
    strides[1] apart: each the 2-D (batch * seqlen, nheads * head_dim) matrix in tiles of block_rows rows of one head.
    `HeadTiles(geometry, block_rows, layout)(t)` is t's descriptor, everything but its base worked out once. Passed by
    value (a __grid_constant__ CUtensorMap), so the programs do not build their own.

    The caller has checked the TMA layout (kernels.flash._ws_layout_problem), so a descriptor is filled in without
    TensorDescriptor.__post_init__'s checks of the same things: 4 a forward call and 7 a backward call, where at 1K
    tokens the host time of a forward+backward is about as long as its kernels."""

    __slots__ = ("fields", "parts")

    def __init__(self, geometry, block_rows: int, layout):
        batch, seqlen, nheads, head_dim = geometry.shape
        self.fields = dict(shape=[batch * seqlen, nheads * head_dim], strides=[geometry.stride(1), 1],
                           block_shape=[block_rows, head_dim], layout=layout, padding="zero")
        # what kernels/launch.py's bound Prepared hands the runner beside the base, instead of a descriptor
        self.parts = (self.fields["shape"], self.fields["strides"], self.fields["padding"])

    def __call__(self, t: torch.Tensor) -> TensorDescriptor:
        desc = object.__new__(TensorDescriptor)
        desc.__dict__.update(self.fields, base=t)
        return desc


def head_tiles(t: torch.Tensor, block_rows: int, layout) -> TensorDescriptor:
    """t's descriptor (HeadTiles)."""
    return HeadTiles(t, block_rows, layout)(t)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _grid(n_tiles: int, n_bh: int, paired: bool, persistent: bool, programs: int | None, device) -> tuple[int]:
    """The launch grid over `_n_units`'s work units: min(units, programs), programs defaulting to one a SM where
    persistent, to one a unit elsewhere."""
    units = ((n_tiles + 1) // 2 if paired else n_tiles) * n_bh
    if programs is None and persistent:
        programs = _sm_count(device.index)
    return (min(units, programs or units),)


def gluon_forward(q, k, v, o, lse, qk_scale: float, causal: bool, programs: int | None = None,
                  dropout_p: float = 0.0, seed: torch.Tensor | None = None) -> None:
    """Fill o (batch, seqlen, nheads, head_dim), contiguous, and lse (batch, nheads, seqlen) float32, contiguous, with
    the attention of q, k, v; qk_scale = softmax scale * log2(e) (the LSE is base 2). The caller has checked
    `unsupported` and the TMA layout of q, k, v (kernels.flash._ws_layout_problem). programs: at most this many
    programs (tests: each then runs many work units), else one a SM where `fwd_persistent`, one a unit elsewhere.
    dropout_p > 0: kernels.flash's dropout with the mask of `seed` (kernels.flash.draw_dropout_seed). kernels.flash's
    own calls make this launch through a plan (`_gluon_fwd_plan`), from the same `forward_launch`."""
    forward_launch(q, k, v, o, lse, seed, qk_scale, causal, dropout_p, programs)(
        q, k, v, o, lse, seed if dropout_p > 0 else lse)


def forward_launch(q, k, v, o, lse, seed, qk_scale: float, causal: bool, dropout_p: float,
                   programs: int | None = None) -> Prepared:
    """The forward kernel's launch for tensors of these geometries (tensors or kernels.flash.TensorGeometry), as
    gluon_forward describes them; called with (q, k, v, o, lse, the seed or, without dropout, lse)."""
    batch, seqlen, nheads, head_dim = q.shape
    if not (o.is_contiguous() and lse.is_contiguous() and o.dtype == q.dtype
            and lse.shape == (batch, nheads, seqlen)):
        raise ValueError("gluon_forward: o must be contiguous in q's dtype and lse contiguous (batch, nheads, seqlen)")
    thresh, drop_scale = _dropout_args("gluon_forward", dropout_p, seed)
    block_m, block_n, stages, q_buffers = FWD_TILES[head_dim]
    persistent = fwd_persistent(head_dim, seqlen, causal)
    paired = causal and persistent
    grid = _grid(seqlen // block_m, batch * nheads, paired, persistent, programs, q.device)
    dtype = _GL_DTYPES[q.dtype]
    q_layout, kv_layout = _shared_layout(block_m // 2, head_dim, dtype), _shared_layout(block_n, head_dim, dtype)
    return Prepared(_fwd_kernel, grid,
                    (seqlen, nheads, batch * nheads, nheads // k.shape[2], qk_scale, launch_head_group(seqlen, causal),
                     thresh, drop_scale),
                    dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, Q_BUFFERS=q_buffers,
                         IS_CAUSAL=causal, PAIRED=paired, CONSUMER_REGS=CONSUMER_REGS, HAS_DROPOUT=dropout_p > 0,
                         num_warps=4, **fwd_forms(head_dim, causal)),
                    (HeadTiles(q, block_m // 2, q_layout), HeadTiles(k, block_n, kv_layout),
                     HeadTiles(v, block_n, kv_layout), HeadTiles(o, block_m // 2, q_layout)))


# ---------------------------------------------------------------------------------------------------
# The backward: FlashAttention-3's division of labour (Shah et al., 2024, section 3.1 and appendix B), one kernel
# and five matmuls per tile pair where kernels/flash.py's backward runs two kernels and seven.
#
#     a key block = 128 keys of one (batch, head); a program runs one or many (`_work_unit`); three partitions:
#     compute (8 warps, two warpgroups of 64 keys)  per query tile i (64 queries), scores kept transposed so that
#                       P^T and dS^T are already the register operands dV and dK need:
#                           S^T = K Q_i^T, dP^T = V dO_i^T        (async wgmma, issued together)
#                           P^T = exp2(S^T * scale * log2 e - LSE_i)
#                           dV += P^T dO_i; dS^T = P^T (dP^T - delta_i); dK += dS^T Q_i
#                           dQ_i = dS K                            (dS^T through shared memory, read transposed)
#                       then dQ_i into a DQ_STAGES-deep shared ring; at the end dK (times the scale) and dV by TMA
#     loader (1 warp)   per key block K and V into one of KV_BUFFERS buffers; Q_i, dO_i by TMA into a STAGES-deep
#                       ring that runs on across key blocks, with LSE_i and delta_i beside them
#     dQ writer (1 warp) adds each dQ_i from the ring to a float32 dQ buffer by one TMA reduce, frees the slot
#
# At head dim 64 `_bwd_split_kernel` runs the same loader and dQ writer, but its two compute warpgroups are separate
# partitions, and a tile's whole dQ_i (over all 128 keys) is computed by one of them, in turns, while the other goes
# on to the next tile: cuDNN's layout, read from its SASS (results/attention/gluon_bwd_profile/README.md).
#
# The TMA reduce makes dQ's summation order vary from run to run, so deterministic mode keeps kernels/flash.py's
# backward. Measured on one H100 against it (results/attention/gluon_bwd/bench_h100_s25.txt, device-built descriptors):
# 1.24-1.39x at head dim 128, 0.87-0.94x cuDNN's backward. At head dim 64, with host descriptors and direct launches
# (results/attention/launch_direct/hd64_bwd_h100.txt): 1.05-1.10x from 2K, causal and not, 0.95-0.99x at 1K. The
# persistent form (below) moved that: 1.03x / 1.03x eager at 1K, 1.00x / 1.02x at GPT-2's 12 heads (causal / not),
# 0.91-0.98x at 512 (results/attention/gluon_bwd_persistent/min_seqlen_h100.txt), hence from 1K there. The split
# kernel moved it again (min_seqlen_split_h100.txt, against the autotuned @triton.jit backward): 1.09-1.13x at 1K,
# GPT-2's 12 heads included, 1.05x at 512 non-causal, 0.91x / 0.94x (eager / graphed) at 512 causal, hence from 512
# non-causal there. The barrier protocol across key blocks is simulated on the CPU
# (results/attention/gluon_bwd_persistent/protocol_sim.py; the split kernel's: gluon_bwd_altdq/protocol_sim.py).
# ---------------------------------------------------------------------------------------------------

BWD_HEAD_DIMS = (64, 128, 256)
# (BLOCK_M, BLOCK_N, STAGES, DQ_STAGES) per head dim: at 128 the fastest of the A/B's three configs; at 64 a 3-deep
# Q/dO ring (133 KB), 1.013-1.035x the 2-deep one at every length 1K-16K, causal and not, on one H100
# (results/attention/gluon_bwd_stages/ab_h100.txt; deeper rings or dQ rings gained less); at 256
# FlashAttention-3's (Shah et al., 2024): 64-key tiles, one stage, the only ones whose K, V, Q, dO, P^T, dS^T and dQ
# tiles fit shared memory (214 KB); compiled for sm_90 it had no spills (results/attention/gluon_bwd256/
# compile_sm90.txt; 16 bytes since the kernel loops over key blocks), and on one H100 it is 1.08-1.30x the
# @triton.jit backward at 512-16K (check_h100.txt).
BWD_TILES = {64: (64, 128, 3, 2), 128: (64, 128, 2, 2), 256: (64, 64, 1, 1)}
BWD_WARPS = 8  # `_bwd_kernel`'s compute partition; the loader and the dQ writer get one warp each
# The persistent grid (one program a SM running many key blocks, `_work_unit`; causal units are pairs of key blocks)
# with a second K/V buffer (133 -> 166 KB: the next key block's K and V load while this one's are in use, and its
# dK/dV store runs beside the next block's first tile), against one key block a program, on one H100
# (results/attention/gluon_bwd_persistent/): head dim 64 1.02-1.11x non-causal and 1.02-1.15x causal at 1K-16K. At
# head dim 128 the second buffer does not fit beside the rings (280 KB), and the persistent grid with one was
# 0.97-1.07x, so head dims 128 and 256 run `_bwd_kernel`, one key block a program. Head dim 64 runs
# `_bwd_split_kernel`, persistent with two K/V buffers: 1.01-1.08x `_bwd_kernel` (persistent, two buffers) at 1K-16K,
# causal and not, on one H100 (results/attention/gluon_bwd_altdq/bench_h100.txt); 182 KB with its two K/V and two
# dS^T buffers. At head dim 128 its 64 x 128 dQ (64 more registers a thread beside dK and dV) made it spill 200-424
# bytes, and it ran 0.56-0.97x `_bwd_kernel` (results/attention/gluon_bwd_split128/).
BWD_SPLIT_HEAD_DIMS = (64,)
BWD_SPLIT_KV_BUFFERS = 2
# `_bwd_kernel` reads LSE_i and delta_i where each is used (`_bwd_tile`'s STATS_AT_USE) at these head dims: at 128
# its spill drops from 56 bytes to 16 (32 causal), and the backward ran 1.01-1.05x the at-the-tile's-start form at
# 1K-16K, causal and not; at 256 (no spill to save) 0.98-0.99x, so it reads them at the start there (one H100,
# results/attention/gluon_bwd_stats_at_use/bench_h100.txt).
BWD_STATS_AT_USE_HEAD_DIMS = (128,)
# The backward's Q/dO ring refill, started sooner (session 45): STATS_AHEAD (`_bwd_loader`, both kernels) reads the
# next tile's LSE and delta before the wait for this tile's slot, EARLY_RELEASE (`_bwd_tile`) releases the slot when
# dV's and dK's wgmma are done instead of after dQ's. At head dim 256, whose ring has one slot (ncu put 31% of all
# stall samples on the compute warps' wait for Q_i and dO_i, results/attention/hd256_profile/), both together ran
# 1.24-1.53x the backward without them at 1K-16K, causal and not, and 1.02-1.14x cuDNN's; at 128 0.96-1.03x and at
# 64 (STATS_AHEAD alone) 0.97-1.02x, so not there (one H100, results/attention/gluon_bwd_early_release/bench_hd*).
BWD_STATS_AHEAD_HEAD_DIMS: tuple = (256,)
BWD_EARLY_RELEASE_HEAD_DIMS: tuple = (256,)
# The same experiment's DQ_ATOMIC (dQ added from registers by atomics, no shared dQ tile, so that head dim 256's ring
# could take a second Q/dO slot) cost 0.85-0.89x at 256 and 0.81-0.86x at 128; with the extra slot (and both flags
# above) 1.00-1.05x at 256 against 1.24-1.53x without. Not shipped, and removed after the run (it is at 385180e).
# Shortest sequences it takes, per (head dim, causal): at head dim 128, in kernels/flash.py's backward with and
# without it, every launch on the direct path (results/attention/launch_direct/short_h100.txt), 1.30x / 1.18x the
# @triton.jit kernels at 1K
# (non-causal / causal), 1.27x at 2K causal, 1.13x / 1.01x at 512 (see MIN_SEQLEN for why 512 stays with them);
# 1.27-1.39x from 4K (results/attention/gluon_bwd/ab_h100.txt). At head dim 256 (results/attention/gluon_bwd256/
# check_h100.txt) forward+backward gains 1.06-1.09x non-causal from 512 and 1.19-1.26x causal from 1K; at 512 causal
# it lost (0.87x: the Gluon launch's host time shows there). With STATS_AHEAD and EARLY_RELEASE the backward alone is
# 1.30x / 1.33x the autotuned @triton.jit one at 512 (non-causal / causal; eager and from CUDA graphs alike,
# results/attention/gluon_bwd_early_release/min_seqlen_hd256_h100.txt), so both start at 512.
BWD_MIN_SEQLEN = {(64, False): 512, (64, True): 1024, (128, False): 1024, (128, True): 1024,
                  (256, False): 512, (256, True): 512}
# Shortest sequences the backward takes with dropout, per (head dim, causal): `_bwd_split_kernel` (head dim 64), the
# mask drawn as in the forward and kept transposed in shared memory. By count its Philox rounds are about a third of a
# tile's five matmuls' SM cycles (about one in the forward), and the @triton.jit backward draws each mask twice. The
# backward alone against the autotuned @triton.jit one, dropout 0.1, on one H100 (results/attention/gluon_bwd_dropout/
# ab_h100.jsonl; eager / graphed): non-causal 1.13x / 1.12x at 1K, 1.20x at 4K; causal 1.02x / 1.05x at 2K, 1.06x /
# 1.10x at 4K, a tie at GPT-2's shape (0.995x / 1.003x) and 0.97x at 1K with 32 heads. With the flags handed to S^T's
# layout as words (session 42, results/attention/gluon_bwd_maskbits/ab_words_h100.txt, graphed): 1.094x at GPT-2's
# shape and 1.061x at 1K with 32 heads, so causal starts at 1K too.
BWD_DROPOUT_MIN_SEQLEN = {(64, False): 1024, (64, True): 1024}


@_core.builtin
def tma_reduce_add_shared(desc, coord, src, _semantic=None):
    """desc[coord block] += src (a shared-memory tile in desc's layout), asynchronously through the TMA unit
    (cp.reduce.async.bulk.tensor .add); wait with tma.store_wait. Gluon 3.6's builder has the op
    (`create_async_tma_reduce`) but no Python wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord, src.handle)


@gluon.constexpr_function
def _tile_layout(warps, rows, n):
    """A (rows x n) wgmma accumulator over `warps` warps: one warp per 16 rows where the rows give each warp its own
    (rows >= 16 * warps), else rows // 16 warps down the rows and the warpgroups side by side along n. A 64-row tile
    laid out one warp per 16 rows over 8 warps is held twice, which at head dim 256 spilled 1.5 KB a thread
    (results/attention/gluon_bwd256/compile_sm90.txt)."""
    down = min(warps, rows // 16)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[down, warps // down],
                                     instr_shape=[16, n // (warps // down), 16])


@gluon.constexpr_function
def _row_layout(n):
    """A (1, n) row over one warp's 32 threads (the loader's LSE and delta tiles)."""
    return gl.BlockedLayout([1, max(n // 32, 1)], [1, 32], [1, 1], [1, 0])


@gluon.jit
def _key_block(bh, pid_n, nheads, seqlen, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
               IS_CAUSAL: gl.constexpr):
    """Key block pid_n of (batch x head) bh: (start_n, first query tile, query tiles end, first row, column, offset of
    its LSE / delta rows)."""
    start_n = pid_n * BLOCK_N
    lo = start_n // BLOCK_M if IS_CAUSAL else 0  # query tiles that see any of these keys (seqlen_q == seqlen_k)
    return start_n, lo, seqlen // BLOCK_M, (bh // nheads) * seqlen, (bh % nheads) * HEAD_DIM, bh.to(gl.int64) * seqlen


@gluon.jit
def _bwd_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready, empty,
                LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr,
                IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, STATS_AHEAD: gl.constexpr = False):
    """K and V per key block, Q_i, dO_i, LSE_i and delta_i per query tile into the ring. Without STATS_AHEAD, LSE_i
    and delta_i are read from global memory after the wait for their slot, each load waited for by its store (two
    round trips, in the sm_90 SASS) before Q_i's and dO_i's TMA loads are issued; where the ring has one slot (head
    dim 256) all of that is on the compute warps' path. STATS_AHEAD: tile i + 1's are loaded before the wait for
    tile i's slot, so they arrive while the loader waits."""
    KV_BYTES: gl.constexpr = BLOCK_N * HEAD_DIM * k_smem.dtype.primitive_bitwidth // 8
    TILE_BYTES: gl.constexpr = BLOCK_M * HEAD_DIM * q_smem.dtype.primitive_bitwidth // 8
    it = 0  # key blocks done by this program
    g = 0  # query tiles loaded so far, over all key blocks: the ring's position
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            kb = it % KV_BUFFERS
            # buffer kb held key block it - KV_BUFFERS until its dK, dV were stored; a fresh barrier passes parity 1
            mbarrier.wait(kv_empty.index(kb), ((it // KV_BUFFERS) & 1) ^ 1)
            mbarrier.expect(kv_ready.index(kb), 2 * KV_BYTES)
            tma.async_copy_global_to_shared(k_desc, [row0 + start_n, col], kv_ready.index(kb), k_smem.index(kb))
            tma.async_copy_global_to_shared(v_desc, [row0 + start_n, col], kv_ready.index(kb), v_smem.index(kb))
            if STATS_AHEAD:
                cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, _row_layout(BLOCK_M)))[None, :]
                lse_next = gl.load(LSE + stat_base + lo * BLOCK_M + cols)
                delta_next = gl.load(DELTA + stat_base + lo * BLOCK_M + cols)
            for i in range(lo, n_end):
                slot = g % STAGES
                if STATS_AHEAD:
                    lse_i = lse_next
                    delta_i = delta_next
                    ahead = gl.minimum(i + 1, n_end - 1) * BLOCK_M + cols  # the last tile loads its own again
                    lse_next = gl.load(LSE + stat_base + ahead)
                    delta_next = gl.load(DELTA + stat_base + ahead)
                    mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
                else:
                    mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)
                    offs = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, _row_layout(BLOCK_M)))[None, :]
                    lse_i = gl.load(LSE + stat_base + offs)
                    delta_i = gl.load(DELTA + stat_base + offs)
                # LSE_i and delta_i stored before the expect's arrive, which releases them with the tile
                lse_smem.index(slot).store(lse_i)
                delta_smem.index(slot).store(delta_i)
                mbarrier.expect(ready.index(slot), 2 * TILE_BYTES)
                tma.async_copy_global_to_shared(q_desc, [row0 + i * BLOCK_M, col], ready.index(slot),
                                                q_smem.index(slot))
                tma.async_copy_global_to_shared(do_desc, [row0 + i * BLOCK_M, col], ready.index(slot),
                                                do_smem.index(slot))
                g += 1
            it += 1


@gluon.jit
def _bwd_dq_writer(dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_STAGES: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr):
    g = 0
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            for i in range(lo, n_end):
                s = g % DQ_STAGES
                mbarrier.wait(dq_full.index(s), (g // DQ_STAGES) & 1)
                tma_reduce_add_shared(dqa_desc, [row0 + i * BLOCK_M, col], dq_smem.index(s))
                tma.store_wait(0)  # the TMA unit has read the slot
                mbarrier.arrive(dq_empty.index(s))
                g += 1


@gluon.jit
def _bwd_tile(k_smem, v_smem, q_s, do_s, pt_smem, ds_smem, lse_s, delta_s, i, start_n, keys, qcols, st_init, dq_init,
              dv, dk, qk_scale, op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              IS_CAUSAL: gl.constexpr, SPLIT: gl.constexpr, STATS_AT_USE: gl.constexpr = False, release=None,
              EARLY_RELEASE: gl.constexpr = False):
    """One query tile i against this program's keys: the five wgmma and the softmax between them. lse_s, delta_s:
    (1, BLOCK_M) shared-memory rows of LSE_i and delta_i, read straight into the scores' layout, at the tile's start,
    or with STATS_AT_USE (BWD_STATS_AT_USE_HEAD_DIMS) each where it is used, which frees their registers over the
    S^T and dP^T matmuls. Returns dV and dK accumulated and this tile's dQ, all waited for. SPLIT (the
    tiles split across the warpgroups along their columns, `_tile_layout`): each warpgroup holds half of P^T's and
    dS^T's columns, and every row of dV and dK needs all of them, so both go through shared memory as the wgmma's
    A operand; otherwise each warp's rows of P^T and dS^T are its own rows of dV and dK, so they stay in registers.
    EARLY_RELEASE: the slot's barrier `release` is arrived once dV's and dK's wgmma are done, the last readers of Q_i
    and dO_i, while dQ's runs (else the caller arrives it after the tile)."""
    dtype: gl.constexpr = q_s.dtype
    st_layout: gl.constexpr = st_init.type.layout
    if not STATS_AT_USE:
        lse = lse_s.load(st_layout)
        delta = delta_s.load(st_layout)
    st_tok = warpgroup_mma(k_smem, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dpt_tok = warpgroup_mma(v_smem, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
    st = warpgroup_mma_wait(1, (st_tok,))
    if STATS_AT_USE:
        lse = lse_s.load(st_layout)
    pt = gl.exp2(st * qk_scale - lse)
    if IS_CAUSAL:  # only the tiles on the diagonal have keys after some of their queries
        if i * BLOCK_M < start_n + BLOCK_N:
            queries = i * BLOCK_M + qcols
            pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
    if SPLIT:
        pt_smem.store(pt.to(dtype))
        dpt = warpgroup_mma_wait(0, (dpt_tok,))
        if STATS_AT_USE:
            delta = delta_s.load(st_layout)
        ds_smem.store((pt * (dpt - delta)).to(dtype))
        fence_async_shared()  # both warpgroups' halves, before the wgmma that read all of them
        dv_tok = warpgroup_mma(pt_smem, do_s, dv, is_async=True)
        dk_tok = warpgroup_mma(ds_smem, q_s, dk, is_async=True)
    else:
        dv_tok = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_s, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, (dpt_tok,))  # dP^T was issued before dV, so it is the one done
        if STATS_AT_USE:
            delta = delta_s.load(st_layout)
        dst = (pt * (dpt - delta)).to(dtype)
        # dS^T's stores go before dK's wgmma is issued, so they are done by the fence that dQ's wgmma waits on:
        # 1.01-1.03x the backward at head dim 64 (results/attention/gluon_bwd_sync/)
        ds_smem.store(dst)
        dk_tok = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
        fence_async_shared()
    dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_init, use_acc=False, is_async=True)
    if EARLY_RELEASE:
        dv, dk = warpgroup_mma_wait(1, (dv_tok, dk_tok))  # issued before dQ's, so they are the ones done
        mbarrier.arrive(release)
        dq = warpgroup_mma_wait(0, (dq_tok,))
    else:
        dv, dk, dq = warpgroup_mma_wait(0, (dv_tok, dk_tok, dq_tok))
    return dv, dk, dq


@gluon.jit
def _bwd_compute(dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem, delta_smem,
                 kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group,
                 qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, WARPS: gl.constexpr,
                 SPLIT: gl.constexpr, STATS_AT_USE: gl.constexpr, EARLY_RELEASE: gl.constexpr):
    # one K/V buffer, key blocks one after another (`_bwd_kernel`)
    st_layout: gl.constexpr = _tile_layout(WARPS, BLOCK_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = _tile_layout(WARPS, BLOCK_N, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    dq_layout: gl.constexpr = _tile_layout(WARPS, BLOCK_M, HEAD_DIM)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    it = 0
    g = 0
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, False), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_n, n_bh, head_group, False, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            k_buf = k_smem.index(0)
            v_buf = v_smem.index(0)
            keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(0), it & 1)
            for i in range(lo, n_end):
                slot = g % STAGES
                mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
                dv, dk, dq = _bwd_tile(k_buf, v_buf, q_smem.index(slot), do_smem.index(slot), pt_smem, ds_smem,
                                         lse_smem.index(slot), delta_smem.index(slot), i, start_n, keys, qcols, st_init,
                                         dq_init, dv, dk, qk_scale, op_layout, BLOCK_M, BLOCK_N, IS_CAUSAL, SPLIT,
                                         STATS_AT_USE, empty.index(slot), EARLY_RELEASE)
                if not EARLY_RELEASE:  # Q_i, dO_i, LSE_i and delta_i are read: the loader may refill the slot
                    mbarrier.arrive(empty.index(slot))
                s = g % DQ_STAGES
                mbarrier.wait(dq_empty.index(s), ((g // DQ_STAGES) & 1) ^ 1)
                dq_smem.index(s).store(dq)
                fence_async_shared()  # the generic-proxy stores, before the TMA unit reads them
                mbarrier.arrive(dq_full.index(s))
                g += 1

            # dK (times the softmax scale) and dV out by TMA through this key block's K and V buffers
            k_buf.store((dk * sm_scale).to(k_buf.dtype))
            v_buf.store(dv.to(v_buf.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [row0 + start_n, col], k_buf)
            tma.async_copy_shared_to_global(dv_desc, [row0 + start_n, col], v_buf)
            tma.store_wait(0)
            mbarrier.arrive(kv_empty.index(0))
            it += 1


@gluon.jit
def _bwd_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, SEED, seqlen, nheads, n_bh,
                qk_scale, sm_scale, head_group, drop_thresh, drop_scale, HEAD_DIM: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr,
                IS_CAUSAL: gl.constexpr, WARPS: gl.constexpr, ds_layout: gl.constexpr,
                STATS_AT_USE: gl.constexpr = False, STATS_AHEAD: gl.constexpr = False,
                EARLY_RELEASE: gl.constexpr = False):
    # q_desc, do_desc: tiles of BLOCK_M queries; k_desc .. dv_desc: of BLOCK_N keys; dqa_desc: of BLOCK_M rows of the
    # float32 dQ buffer (batch * seqlen, nheads * HEAD_DIM), zeroed by the caller.
    # LSE, DELTA: (batch, nheads, seqlen).
    # SEED, drop_thresh, drop_scale: `_bwd_split_kernel`'s dropout, which this kernel does not take (the launcher
    # passes both kernels one argument list)
    # Each program runs work units pid, pid + programs, ... (`_work_unit` over single key blocks), one K/V buffer
    KV_BUFFERS: gl.constexpr = 1
    PAIRED: gl.constexpr = False
    dtype: gl.constexpr = q_desc.dtype
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    SPLIT: gl.constexpr = BLOCK_N < 16 * WARPS  # see _tile_layout and _bwd_tile
    if SPLIT:
        pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    else:  # not read: P^T stays in registers
        pt_smem = ds_smem
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    # the argument tuples are written out in the call (a named tuple turns constexprs into tensors)
    gl.warp_specialize([
        (_bwd_compute, (dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, pt_smem, ds_smem, dq_smem, lse_smem,
                        delta_smem, kv_ready, kv_empty, ready, empty, dq_full, dq_empty, n_n, n_bh, nheads,
                        seqlen, head_group, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES,
                        IS_CAUSAL, WARPS, SPLIT, STATS_AT_USE, EARLY_RELEASE)),
        (_bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready,
                       empty, LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                       BLOCK_N, HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, STATS_AHEAD)),
        (_bwd_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                          BLOCK_N, HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED))],
        [1, 1], [24, 24])


@gluon.jit
def _keep_t(words, W: gl.constexpr, st_layout: gl.constexpr, SUB_N: gl.constexpr):
    """Warpgroup W's keep flags in S^T's layout (SUB_N keys x BLOCK_M queries) from words (warpgroup x half, 1,
    BLOCK_M): per half of SUB_N // 2 keys one int32 a query, bit c the flag of the half's key c."""
    w0 = words.index(2 * W).load(st_layout)
    w1 = words.index(2 * W + 1).load(st_layout)
    kk = gl.arange(0, SUB_N, layout=gl.SliceLayout(1, st_layout))[:, None]
    return ((gl.where(kk < SUB_N // 2, w0, w1) >> (kk % (SUB_N // 2))) & 1) != 0


@gluon.jit
def _bwd_half(W: gl.constexpr, dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
              delta_smem, kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh, nheads,
              seqlen, head_group, qk_scale, sm_scale, SEED, drop_thresh, drop_scale, words_smem,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              DQ_STAGES: gl.constexpr, KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr,
              HAS_DROPOUT: gl.constexpr):
    """`_bwd_split_kernel`'s compute warpgroup W (4 warps): keys start_n + 64 W .. + 63 of each key block. Per query
    tile g (counted over all key blocks): S^T, dP^T, P^T, dV and dK for its keys, as `_bwd_tile`, with its dS^T half
    stored to the tile's buffer b = g % 2; then, if g % 2 == W, the tile's whole dQ = dS K over both halves.
    HAS_DROPOUT: kernels.flash's dropout backward with its mask (kernels/gluon_dropout.py), drawn with queries as
    rows, where one Philox call is one thread's 8 scores, and moved to S^T's layout through shared memory as one
    int32 a query and 32 keys (`_keep_t`), as kernels.flash's keys-as-rows dK/dV step reads it: dV takes P^T with the
    dropped scores zeroed and the kept ones scaled, dS^T takes dP^T the same way."""
    SUB_N: gl.constexpr = BLOCK_N // 2
    st_layout: gl.constexpr = _tile_layout(4, SUB_N, BLOCK_M)
    kv_acc_layout: gl.constexpr = _tile_layout(4, SUB_N, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_acc_layout, k_width=2)
    dq_layout: gl.constexpr = _tile_layout(4, BLOCK_M, HEAD_DIM)
    qcols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    st_init = gl.zeros([SUB_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    qk_layout: gl.constexpr = _acc_layout(4, SUB_N // 2)  # (queries, keys) half tiles, one warp per 16 queries
    if HAS_DROPOUT:
        seed = gl.load(SEED)
        # the words, written a query a row as the draw's layout holds them, read a query a column as S^T's does
        words_by_row = words_smem._reinterpret(gl.int32, [4, BLOCK_M, 1], words_smem.layout)
    else:
        seed = 0
    it = 0
    g = 0
    for u in range(gl.program_id(0), _n_units(n_n, n_bh, PAIRED), gl.num_programs(0)):
        bh, first, second, count = _work_unit(u, n_n, n_bh, head_group, PAIRED, False)
        for half in range(count):
            start_n, lo, n_end, row0, col, stat_base = _key_block(bh, gl.where(half == 0, first, second), nheads,
                                                                  seqlen, BLOCK_M, BLOCK_N, HEAD_DIM, IS_CAUSAL)
            start_w = start_n + W * SUB_N
            kb = it % KV_BUFFERS
            k_buf = k_smem.index(kb)
            k_w = k_buf.slice(W * SUB_N, SUB_N)
            v_w = v_smem.index(kb).slice(W * SUB_N, SUB_N)
            keys = start_w + gl.arange(0, SUB_N, layout=gl.SliceLayout(1, st_layout))
            dk = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            dv = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_acc_layout)
            mbarrier.wait(kv_ready.index(kb), (it // KV_BUFFERS) & 1)
            for i in range(lo, n_end):
                slot = g % STAGES
                if HAS_DROPOUT:  # drawn first, while Q_i and dO_i may still be loading, in two halves of 32 keys (a
                    # whole tile's Philox calls at once spilled beside dK and dV). Each query's 32 flags go to shared
                    # memory as one int32, for S^T's layout to read: 1.07-1.14x the backward that moved them as 32
                    # transposed bytes (results/attention/gluon_bwd_maskbits/)
                    for h in gl.static_range(2):
                        keep = keep_rows(seed, bh, i * BLOCK_M, start_w + h * (SUB_N // 2), drop_thresh, qk_layout,
                                         BLOCK_M, SUB_N // 2, 4)
                        kbit = gl.arange(0, SUB_N // 2, layout=gl.SliceLayout(0, qk_layout))
                        words = gl.sum(keep.to(gl.int32) << kbit[None, :], axis=1)
                        words_by_row.index(2 * W + h).store(gl.expand_dims(words, 1))
                    gl.thread_barrier()  # this warpgroup's threads read each other's
                mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
                q_s = q_smem.index(slot)
                do_s = do_smem.index(slot)
                lse = lse_smem.index(slot).load(st_layout)
                delta = delta_smem.index(slot).load(st_layout)
                st_tok = warpgroup_mma(k_w, q_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
                dpt_tok = warpgroup_mma(v_w, do_s.permute((1, 0)), st_init, use_acc=False, is_async=True)
                st = warpgroup_mma_wait(1, (st_tok,))
                pt = gl.exp2(st * qk_scale - lse)
                if IS_CAUSAL:  # only the tiles on the diagonal have keys after some of their queries
                    if i * BLOCK_M < start_w + SUB_N:
                        queries = i * BLOCK_M + qcols
                        pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
                if HAS_DROPOUT:
                    pt_kept = gl.where(_keep_t(words_smem, W, st_layout, SUB_N), pt * drop_scale, 0.0)
                else:
                    pt_kept = pt
                dv_tok = warpgroup_mma(gl.convert_layout(pt_kept.to(q_s.dtype), op_layout), do_s, dv, is_async=True)
                dpt = warpgroup_mma_wait(1, (dpt_tok,))
                if HAS_DROPOUT:
                    dpt = gl.where(_keep_t(words_smem, W, st_layout, SUB_N), dpt * drop_scale, 0.0)
                dst = (pt * (dpt - delta)).to(q_s.dtype)
                b = g % 2
                # the dQ of tile g - 2 has read this dS^T buffer (a fresh barrier passes parity 1)
                mbarrier.wait(ds_free.index(b), ((g // 2) & 1) ^ 1)
                ds_smem.index(2 * b + W).store(dst)
                dk_tok = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
                fence_async_shared()
                mbarrier.arrive(ds_full.index(b))  # count 2: both halves of tile g's dS^T stored
                dv, dk = warpgroup_mma_wait(0, (dv_tok, dk_tok))
                mbarrier.arrive(empty.index(slot))  # count 2: Q_i, dO_i, LSE_i, delta_i read by both warpgroups
                if (i == lo) & (it > 0):
                    tma.store_wait(0)  # this warpgroup's half of the last key block's dK, dV has left its buffer
                    mbarrier.arrive(kv_empty.index((it - 1) % KV_BUFFERS))  # count 2
                if g % 2 == W:  # this warpgroup's turn: the tile's whole dQ, two chained m64n64 wgmma
                    mbarrier.wait(ds_full.index(b), (g // 2) & 1)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * b).permute((1, 0)), k_buf.slice(0, SUB_N), dq_init,
                                           use_acc=False, is_async=True)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * b + 1).permute((1, 0)), k_buf.slice(SUB_N, SUB_N),
                                           dq_tok, is_async=True)
                    dq = warpgroup_mma_wait(0, (dq_tok,))
                    mbarrier.arrive(ds_free.index(b))
                    s = g % DQ_STAGES
                    mbarrier.wait(dq_empty.index(s), ((g // DQ_STAGES) & 1) ^ 1)
                    dq_smem.index(s).store(dq)
                    fence_async_shared()  # the generic-proxy stores, before the TMA unit reads them
                    mbarrier.arrive(dq_full.index(s))
                g += 1
            # the key block's last dQ (either warpgroup's) reads both K halves: done before dK overwrites this one
            mbarrier.wait(ds_free.index((g - 1) % 2), ((g - 1) // 2) & 1)
            k_w.store((dk * sm_scale).to(k_w.dtype))
            v_w.store(dv.to(v_w.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(dk_desc, [row0 + start_w, col], k_w)
            tma.async_copy_shared_to_global(dv_desc, [row0 + start_w, col], v_w)
            it += 1
    tma.store_wait(0)


@gluon.jit
def _bwd_split_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, dqa_desc, LSE, DELTA, SEED, seqlen,
                      nheads, n_bh, qk_scale, sm_scale, head_group, drop_thresh, drop_scale, HEAD_DIM: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr,
                      KV_BUFFERS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, ds_layout: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, HAS_DROPOUT: gl.constexpr = False,
                      STATS_AHEAD: gl.constexpr = False):
    """`_bwd_kernel`'s arguments, but dk_desc and dv_desc in tiles of BLOCK_N // 2 keys (a warpgroup's half), and
    persistent with KV_BUFFERS K/V buffers. Beyond `_bwd_kernel`'s barriers: ds_full[b] (count 2: both dS^T halves of
    the tile in buffer b stored) and ds_free[b] (its dQ wgmma done). The protocol is simulated on the CPU
    (results/attention/gluon_bwd_altdq/protocol_sim.py: 1,800 interleavings, 5 single mutations caught)."""
    gl.static_assert(KV_BUFFERS > 1, "one K/V buffer would need its release after each key block's dK, dV stores")
    dtype: gl.constexpr = q_desc.dtype
    SUB_N: gl.constexpr = BLOCK_N // 2
    n_n = seqlen // BLOCK_N
    k_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_BUFFERS, BLOCK_N, HEAD_DIM], k_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [4, SUB_N, BLOCK_M], ds_layout)  # [tile buffer x warpgroup half]
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dqa_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    # with dropout, each warpgroup's keep flags of its S^T tile as words (`_bwd_half`), (warpgroup x half of its keys,
    # 1, queries); a one-word stand-in without
    words_smem = gl.allocate_shared_memory(gl.int32, [4, 1, BLOCK_M] if HAS_DROPOUT else [1, 1, 1], stats_layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], stats_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both warpgroups' halves stored
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both warpgroups done with the slot
    for i in gl.static_range(2):
        mbarrier.init(ds_full.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=1)
    for i in gl.static_range(DQ_STAGES):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    fence_async_shared()
    # each compute partition's index goes in as a constexpr, one `_bwd_half` per index (see `_fwd_kernel`)
    gl.warp_specialize([
        (_bwd_half, (gl.constexpr(0), dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                      delta_smem, kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh,
                      nheads, seqlen, head_group, qk_scale, sm_scale, SEED, drop_thresh, drop_scale, words_smem,
                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, HAS_DROPOUT)),
        (_bwd_half, (gl.constexpr(1), dk_desc, dv_desc, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, lse_smem,
                      delta_smem, kv_ready, kv_empty, ready, empty, ds_full, ds_free, dq_full, dq_empty, n_n, n_bh,
                      nheads, seqlen, head_group, qk_scale, sm_scale, SEED, drop_thresh, drop_scale, words_smem,
                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DQ_STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, HAS_DROPOUT)),
        (_bwd_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready, kv_empty, ready,
                       empty, LSE, DELTA, lse_smem, delta_smem, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                       BLOCK_N, HEAD_DIM, STAGES, KV_BUFFERS, IS_CAUSAL, PAIRED, STATS_AHEAD)),
        (_bwd_dq_writer, (dqa_desc, dq_smem, dq_full, dq_empty, n_n, n_bh, nheads, seqlen, head_group, BLOCK_M,
                          BLOCK_N, HEAD_DIM, DQ_STAGES, IS_CAUSAL, PAIRED))],
        [4, 1, 1], [CONSUMER_REGS, 24, 24])


@functools.lru_cache(maxsize=None)
def bwd_layouts(head_dim: int, dtype, split: bool) -> dict:
    """The shared layouts of the backward's tiles at this head dim (BWD_TILES): its descriptors' (Q / dO, K / V, dK /
    dV, the float32 dQ buffer) and dS^T's (and P^T's), which it takes as a constexpr (its compute partitions build
    the register layouts themselves). split: for `_bwd_split_kernel`, which writes dK, dV and dS^T by halves of the
    key block."""
    block_m, block_n = BWD_TILES[head_dim][:2]
    dkv_rows = block_n // 2 if split else block_n
    return dict(q_layout=_shared_layout(block_m, head_dim, dtype),
                kv_layout=_shared_layout(block_n, head_dim, dtype),
                dkv_rows=dkv_rows, dkv_layout=_shared_layout(dkv_rows, head_dim, dtype),
                ds_layout=_shared_layout(dkv_rows, block_m, dtype),
                dqa_layout=_shared_layout(block_m, head_dim, gl.float32))


def bwd_unsupported(q, k, causal: bool, dropout_p: float, varlen: bool) -> str | None:
    """Why this backward cannot take these inputs (beyond kernels.flash's platform, layout and determinism checks),
    or None."""
    head_dim = q.shape[-1]
    if head_dim not in BWD_HEAD_DIMS:
        return f"head dim {head_dim}, not one of {BWD_HEAD_DIMS}"
    if q.shape[-2] != k.shape[-2]:
        return "grouped-query attention (dK, dV would sum over the group)"
    return _scope_problem(q, k, causal, dropout_p, varlen, BWD_MIN_SEQLEN[head_dim, causal], BWD_DROPOUT_MIN_SEQLEN)


def gluon_backward(do, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool,
                   programs: int | None = None, dropout_p: float = 0.0, seed: torch.Tensor | None = None,
                   dq_accum: torch.Tensor | None = None) -> None:
    """Fill dq, dk, dv (q's shape and dtype; any row stride TMA can write, e.g. views of one packed dqkv) with the
    gradients of softmax_scale-scaled attention of q, k, v at do; lse: the forward's base-2 log-sum-exp and delta =
    rowsum(dO * O), both (batch, nheads, seqlen) contiguous float32. The caller has checked `bwd_unsupported`, the
    TMA layout of q, k, v, do, dk, dv (kernels.flash._ws_layout_problem). programs: at most this many programs
    (tests: each then runs many key blocks), else one a SM at BWD_SPLIT_HEAD_DIMS, one a key block elsewhere.
    dropout_p > 0 (BWD_SPLIT_HEAD_DIMS only): the forward's dropout, the mask of `seed`. dq_accum: the float32 buffer
    the kernel adds dQ into, q's shape, contiguous and already zeroed (kernels.flash.bwd_preprocess zeroes it in its
    launch); else a zeroed one is allocated here. kernels.flash's own calls make these launches through a plan
    (`_gluon_bwd_plan`), from the same `backward_launch`."""
    if dq_accum is None:
        dqa = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    elif dq_accum.dtype != torch.float32 or dq_accum.shape != q.shape or not dq_accum.is_contiguous():
        raise ValueError(f"gluon_backward: dq_accum must be contiguous float32 of q's shape {tuple(q.shape)}, got "
                         f"{dq_accum.dtype} {tuple(dq_accum.shape)} strides {dq_accum.stride()}")
    else:
        dqa = dq_accum
    backward_launch(q, k, v, do, dk, dv, dqa, lse, delta, seed, softmax_scale, causal, dropout_p, programs)(
        q, do, k, v, dk, dv, dqa, lse, delta, seed if dropout_p > 0 else lse)
    scale_cast(dqa, softmax_scale, dq)  # one pass over the float32 buffer


def backward_launch(q, k, v, do, dk, dv, dq_accum, lse, delta, seed, softmax_scale: float, causal: bool,
                    dropout_p: float, programs: int | None = None) -> Prepared:
    """The backward kernel's launch for tensors of these geometries (tensors or kernels.flash.TensorGeometry), as
    gluon_backward describes them; called with (q, do, k, v, dk, dv, dq_accum, lse, delta, the seed or, without
    dropout, lse)."""
    batch, seqlen, nheads, head_dim = q.shape
    if not (lse.is_contiguous() and delta.is_contiguous() and lse.shape == delta.shape == (batch, nheads, seqlen)):
        raise ValueError("gluon_backward: lse and delta must be contiguous (batch, nheads, seqlen)")
    if dropout_p > 0 and head_dim not in BWD_SPLIT_HEAD_DIMS:
        raise ValueError(f"gluon_backward: dropout needs head dim in {BWD_SPLIT_HEAD_DIMS}")
    thresh, drop_scale = _dropout_args("gluon_backward", dropout_p, seed)
    block_m, block_n, stages, dq_stages = BWD_TILES[head_dim]
    split = head_dim in BWD_SPLIT_HEAD_DIMS  # persistent, causal units paired
    grid = _grid(seqlen // block_n, batch * nheads, causal and split, split, programs, q.device)
    lay = bwd_layouts(head_dim, _GL_DTYPES[q.dtype], split)
    descriptors = (HeadTiles(q, block_m, lay["q_layout"]), HeadTiles(do, block_m, lay["q_layout"]),
                   HeadTiles(k, block_n, lay["kv_layout"]), HeadTiles(v, block_n, lay["kv_layout"]),
                   HeadTiles(dk, lay["dkv_rows"], lay["dkv_layout"]), HeadTiles(dv, lay["dkv_rows"], lay["dkv_layout"]),
                   HeadTiles(dq_accum, block_m, lay["dqa_layout"]))
    numbers = (seqlen, nheads, batch * nheads, softmax_scale * LOG2E, softmax_scale, launch_head_group(seqlen, causal),
               thresh, drop_scale)
    consts = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_STAGES=dq_stages,
                  IS_CAUSAL=causal, ds_layout=lay["ds_layout"])
    if split:
        return Prepared(_bwd_split_kernel, grid, numbers,
                        dict(consts, KV_BUFFERS=BWD_SPLIT_KV_BUFFERS, PAIRED=causal, CONSUMER_REGS=CONSUMER_REGS,
                             HAS_DROPOUT=dropout_p > 0, STATS_AHEAD=head_dim in BWD_STATS_AHEAD_HEAD_DIMS,
                             num_warps=4), descriptors)
    return Prepared(_bwd_kernel, grid, numbers,
                    dict(consts, WARPS=BWD_WARPS, num_warps=BWD_WARPS, STATS_AT_USE=head_dim in BWD_STATS_AT_USE_HEAD_DIMS,
                         STATS_AHEAD=head_dim in BWD_STATS_AHEAD_HEAD_DIMS,
                         EARLY_RELEASE=head_dim in BWD_EARLY_RELEASE_HEAD_DIMS), descriptors)
