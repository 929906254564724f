"""The altdq backward's barrier protocol (altdq_bwd.py at b1ff20f, shipped as kernels/flash_gluon.py
`_bwd_split_kernel`: the shipped `_bwd_loader`, two `_altdq_compute` warpgroups
and the shipped `_bwd_dq_writer`), simulated on the CPU with ../gluon_bwd_pp64/protocol_sim.py's simulator (K/V
buffers in halves, each warpgroup's TMA stores; on the shipped backward's simulators). The generators mirror the
partitions' waits and arrives line for line, over the key blocks of one persistent program.

New against pp64's protocol:
- the dS^T halves, double-buffered by tile, joined by ds_full (count 2) and freed by ds_free (count 1);
- one warpgroup a tile (g % 2; or the first always, TURNS off) reading both halves and both K halves for the tile's
  whole dQ, into one dQ ring;
- each warpgroup waiting for the block's last dQ before it writes dK / dV into its K / V half.

Checked over random interleavings, key-block lists, ring depths and 1-2 K/V buffers:
- nothing deadlocks;
- every read finds the tile, unit or half it expects: a dS^T half is not overwritten before its tile's dQ read it,
  and K is not overwritten by dK before the block's last dQ read it;
- each tile's dQ is reduced once.

Each of five single mutations is caught.

    python results/attention/gluon_bwd_altdq/protocol_sim.py     # prints the cases run; raises on a violation
"""
import importlib.util
import os
import random

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("pp64_protocol_sim", os.path.join(_here, "..", "gluon_bwd_pp64",
                                                                                 "protocol_sim.py"))
_pp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pp)
Barrier, check_mutations = _pp.Barrier, _pp._bwd.check_mutations

BUGS = ("ds_full count 1", "ds_free wait without the flip", "no ds_free wait before the dK store",
        "dQ without the ds_full wait", "K/V buffer freed by one warpgroup")


class Sim(_pp.Sim):
    def __init__(self, stages, dq_stages, kv_buffers, rng, bug=None):
        super().__init__(stages, dq_stages, kv_buffers, rng, "K/V buffer freed by one warpgroup"
                         if bug == "K/V buffer freed by one warpgroup" else None)
        self.ds_full = [Barrier(1 if bug == "ds_full count 1" else 2) for _ in range(2)]
        self.ds_free = [Barrier(1) for _ in range(2)]
        self.ds_read = set()  # tiles whose dQ has read both dS^T halves

    def write_ds(self, b, w, tile):
        old = self.smem.get(("ds", b, w))
        if old is not None and old not in self.ds_read:
            raise AssertionError(f"warpgroup {w} overwrote dS^T buffer {b} (tile {old}) before its dQ read it")
        self.smem[("ds", b, w)] = tile


def compute(s, w, blocks, stages, dq_stages, kv_buffers, bug, turns=True):
    it = g = 0
    for unit, n_tiles in blocks:
        kb = it % kv_buffers
        yield s.kv_ready[kb], (it // kv_buffers) & 1
        for j in range(n_tiles):
            slot = g % stages
            yield s.ready[slot], (g // stages) & 1
            for x in ("k", "v"):
                s.read(w, (x, kb, w), unit)
            for buf in ("q", "do", "stats"):
                s.read(w, (buf, slot), g)
            b = g % 2
            flip = 0 if bug == "ds_free wait without the flip" else 1
            yield s.ds_free[b], ((g // 2) & 1) ^ flip
            s.write_ds(b, w, g)
            s.ds_full[b].arrive()
            s.empty[slot].arrive()
            s.released[w].add(g)
            if kv_buffers > 1 and j == 0 and it > 0:
                yield from s.store_wait(w)
                s.kv_empty[(it - 1) % kv_buffers].arrive()
            if (g % 2 if turns else 0) == w:  # TURNS, else the first warpgroup takes every dQ
                if bug != "dQ without the ds_full wait":
                    yield s.ds_full[b], (g // 2) & 1
                for h in (0, 1):
                    s.read(w, ("ds", b, h), g)
                    s.read(w, ("k", kb, h), unit)
                s.ds_read.add(g)
                s.ds_free[b].arrive()
                d = g % dq_stages
                yield s.dq_empty[0][d], ((g // dq_stages) & 1) ^ 1
                s.write_dq(0, d, g)
                s.dq_full[0][d].arrive()
            g += 1
        if bug != "no ds_free wait before the dK store":
            yield s.ds_free[(g - 1) % 2], ((g - 1) // 2) & 1
        for x in ("k", "v"):
            s.write_result(w, (x, kb, w), unit)
        if kv_buffers == 1:
            yield from s.store_wait(w)
            s.kv_empty[0].arrive()
        it += 1
    yield from s.store_wait(w)


def dq_writer(s, n_tiles, dq_stages):
    for t in range(n_tiles):
        d = t % dq_stages
        yield s.dq_full[0][d], (t // dq_stages) & 1
        s.reduce(0, d, t)
        s.dq_empty[0][d].arrive()  # after tma.store_wait(0)


def simulate(blocks, stages, dq_stages, kv_buffers, rng, bug=None, turns=True):
    s = Sim(stages, dq_stages, kv_buffers, rng, bug)
    n = sum(t for _, t in blocks)
    s.run({"loader": _pp.loader(s, blocks, stages, kv_buffers),
           "c0": compute(s, 0, blocks, stages, dq_stages, kv_buffers, bug, turns),
           "c1": compute(s, 1, blocks, stages, dq_stages, kv_buffers, bug, turns),
           "dq": dq_writer(s, n, dq_stages)})
    if sorted(s.reduced) != [(0, t) for t in range(n)]:
        raise AssertionError("dQ tiles not each reduced once")
    if any(s.pending):
        raise AssertionError(f"dK/dV stores never waited for: {s.pending}")


def main():
    rng = random.Random(0)
    cases = 0
    for kv_buffers in (1, 2):
        for stages in (2, 3, 4):
            for dq_stages in (1, 2):
                for _ in range(150):
                    causal = rng.random() < 0.5
                    blocks = [(u, rng.randint(1, 8) if causal else 4) for u in range(rng.randint(1, 6))]
                    simulate(blocks, stages, dq_stages, kv_buffers, rng, turns=rng.random() < 0.7)
                    cases += 1
    print(f"{cases} random interleavings (1-6 key blocks of 1-8 query tiles, ring depths 2-4, dQ rings 1-2, 1-2 K/V "
          "buffers, two compute warpgroups taking dQ in turns or the first taking all): no deadlock, no stale or early-overwritten tile, "
          "half buffer or dS^T half, each dQ tile reduced once")
    check_mutations(BUGS, lambda bug: simulate([(u, rng.randint(1, 5)) for u in range(4)], 2, 2, 2, rng, bug))


if __name__ == "__main__":
    main()
