"""The pp64 backward's barrier protocol (pp64_bwd.py: the shipped `_bwd_loader`, two `_pp_compute` warpgroups and
`_pp_dq_writer`), simulated on the CPU with the shipped backward's simulators (../gluon_bwd/protocol_sim.py, on
../gluon_fwd/protocol_sim.py: mbarriers with hardware parity semantics, TMA copies that land at random later times,
a random scheduler). The generators mirror the partitions' waits and arrives line for line, over the key blocks of
one persistent program.

What is new against the persistent backward's simulation (../gluon_bwd_persistent/protocol_sim.py): two compute
warpgroups, each reading and writing only its own half of a K/V buffer, each with its own dQ ring; a Q / dO / stats
slot and a K/V buffer are refilled only once both have released them (count 2); the dQ warp reduces both partials
of every query tile. The loader copies each K and V tile whole; here each copy is modelled as its two halves, which
land separately (the barrier waits for both either way).

Checked over random interleavings, key-block lists, ring depths and 1-2 K/V buffers: nothing deadlocks; a warpgroup
reads only the K/V half and the Q / dO / stats slot it expects; the loader overwrites neither before both
warpgroups' dK / dV halves have been stored from it; each (warpgroup, query tile) dQ partial is reduced once
(under SKIP, none of the second warpgroup's for a key block's first query tile). Each of five single mutations is
caught, with SKIP and without.

    python results/attention/gluon_bwd_pp64/protocol_sim.py     # prints the cases run; raises on a violation
"""
import importlib.util
import os
import random

_here = os.path.dirname(os.path.abspath(__file__))


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_here, rel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bwd = _load("gluon_bwd_protocol_sim", "../gluon_bwd/protocol_sim.py")
Barrier = _bwd.Barrier

BUGS = ("K/V buffer freed by one warpgroup", "Q/dO slot freed by one warpgroup",
        "warpgroup hands its K/V half back before its store wait", "writer waits for one partial",
        "warpgroup writes its dK/dV into the other half")


class _NoBarrier:
    def arrive(self):
        pass


class Sim(_bwd.Sim):
    """The shipped backward's two-partition simulator plus K/V buffers in halves and each warpgroup's TMA stores."""

    def __init__(self, stages, dq_stages, kv_buffers, rng, bug=None, writer_releases=False):
        one = bug == "Q/dO slot freed by one warpgroup" or writer_releases  # the dQ warp's single arrive
        super().__init__(2, stages, dq_stages, rng, "release count 1" if one else None)
        self.kv_ready = [Barrier(1 + 4) for _ in range(kv_buffers)]  # the expect, K and V as two halves each
        self.kv_empty = [Barrier(1 if bug == "K/V buffer freed by one warpgroup" else 2) for _ in range(kv_buffers)]
        self.pending = [[], []]  # each warpgroup's TMA stores in flight: (half buffer, unit)

    def tma(self, bar, buf, tile):
        if buf[0] in ("k", "v"):
            old = self.smem.get(buf)
            if old is not None and not (isinstance(old, tuple) and self.smem.get(("stored", buf)) == old[1]):
                raise AssertionError(f"loader overwrote {buf} holding {old} before its dK/dV store landed")
        super().tma(bar, buf, tile)

    def write_result(self, w, buf, unit):
        if self.smem.get(buf) != unit:
            raise AssertionError(f"warpgroup {w} wrote its result into {buf}, which holds {self.smem.get(buf)}")
        self.smem[buf] = ("result", unit)
        self.pending[w].append((buf, unit))
        self.in_flight.append((_NoBarrier(), ("stored", buf), unit))

    def store_wait(self, w):
        """tma.store_wait(0) of warpgroup w: its own stores only."""
        class _Done:
            def passes(_, parity):
                return all(self.smem.get(("stored", b)) == u for b, u in self.pending[w])
        done = _Done()
        while not done.passes(0):
            yield done, 0
        self.pending[w] = []


def loader(s, blocks, stages, kv_buffers):
    it = g = 0
    for unit, n_tiles in blocks:
        kb = it % kv_buffers
        yield s.kv_empty[kb], ((it // kv_buffers) & 1) ^ 1
        s.kv_ready[kb].arrive()  # mbarrier.expect
        for x in ("k", "v"):
            for half in (0, 1):
                s.tma(s.kv_ready[kb], (x, kb, half), unit)
        for _ in range(n_tiles):
            slot = g % stages
            yield s.empty[slot], ((g // stages) & 1) ^ 1
            s.write(("stats", slot), g)
            s.ready[slot].arrive()
            s.tma(s.ready[slot], ("q", slot), g)
            s.tma(s.ready[slot], ("do", slot), g)
            g += 1
        it += 1


def compute(s, w, blocks, stages, dq_stages, kv_buffers, bug, skip=False, writer_releases=False):
    it = g = gq = 0  # gq: dQ partials handed over (under skip, the second warpgroup hands none for a block's first tile)
    mine = 1 - w if bug == "warpgroup writes its dK/dV into the other half" else w
    for unit, n_tiles in blocks:
        kb = it % kv_buffers
        yield s.kv_ready[kb], (it // kv_buffers) & 1
        for j in range(n_tiles):
            slot = g % stages
            yield s.ready[slot], (g // stages) & 1
            for x in ("k", "v"):
                s.read(w, (x, kb, w), unit)
            skipped = skip and w == 1 and j == 0
            if not skipped:
                for buf in ("q", "do", "stats"):
                    s.read(w, (buf, slot), g)
            if not writer_releases:
                s.empty[slot].arrive()
            s.released[w].add(g)  # its reads of the slot are done (the dQ warp frees it if writer_releases)
            if kv_buffers > 1 and j == 0 and it > 0:
                if bug != "warpgroup hands its K/V half back before its store wait":
                    yield from s.store_wait(w)
                s.kv_empty[(it - 1) % kv_buffers].arrive()
            if not skipped:
                d = gq % dq_stages
                yield s.dq_empty[w][d], ((gq // dq_stages) & 1) ^ 1
                s.write_dq(w, d, g)
                s.dq_full[w][d].arrive()
                gq += 1
            g += 1
        for x in ("k", "v"):
            s.write_result(w, (x, kb, mine), unit)
        if kv_buffers == 1:
            if bug != "warpgroup hands its K/V half back before its store wait":
                yield from s.store_wait(w)
            s.kv_empty[0].arrive()
        it += 1
    yield from s.store_wait(w)


def dq_writer(s, blocks, dq_stages, bug, skip=False, stages=None, writer_releases=False):
    t = g1 = 0  # t: query tiles (and the first warpgroup's partials); g1: the second warpgroup's partials
    for _, n_tiles in blocks:
        for j in range(n_tiles):
            d, d1 = t % dq_stages, g1 % dq_stages
            yield s.dq_full[0][d], (t // dq_stages) & 1
            s.reduce(0, d, t)
            early = writer_releases and bug == "writer frees the slot before the second partial"
            if early:
                s.empty[t % stages].arrive()
            second = not (skip and j == 0)
            if second:
                if bug != "writer waits for one partial":
                    yield s.dq_full[1][d1], (g1 // dq_stages) & 1
                s.reduce(1, d1, t)
            if writer_releases and not early:
                s.empty[t % stages].arrive()
            s.dq_empty[0][d].arrive()
            if second:
                s.dq_empty[1][d1].arrive()
                g1 += 1
            t += 1


def simulate(blocks, stages, dq_stages, kv_buffers, rng, bug=None, skip=False, writer_releases=False):
    s = Sim(stages, dq_stages, kv_buffers, rng, bug, writer_releases)
    n = sum(t for _, t in blocks)
    s.run({"loader": loader(s, blocks, stages, kv_buffers),
           "c0": compute(s, 0, blocks, stages, dq_stages, kv_buffers, bug, skip, writer_releases),
           "c1": compute(s, 1, blocks, stages, dq_stages, kv_buffers, bug, skip, writer_releases),
           "dq": dq_writer(s, blocks, dq_stages, bug, skip, stages, writer_releases)})
    firsts = {sum(t for _, t in blocks[:b]) for b in range(len(blocks))} if skip else set()
    if sorted(s.reduced) != sorted((w, t) for w in range(2) for t in range(n) if not (w == 1 and t in firsts)):
        raise AssertionError("dQ partials not each reduced once")
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
                    # SKIP (causal only): the second warpgroup skips each key block's first query tile;
                    # WRITER_RELEASES (not with SKIP): the dQ warp frees the Q / dO slots
                    skip = causal and rng.random() < 0.5
                    simulate(blocks, stages, dq_stages, kv_buffers, rng, skip=skip,
                             writer_releases=not skip and rng.random() < 0.5)
                    cases += 1
    print(f"{cases} random interleavings (1-6 key blocks of 1-8 query tiles, ring depths 2-4, dQ rings 1-2, 1-2 K/V "
          "buffers, two compute warpgroups): no deadlock, no stale or overwritten tile or half buffer, each dQ "
          "partial reduced once")
    for skip, wr in ((False, False), (True, False), (False, True)):
        print(f"mutations, skip={skip}, writer_releases={wr}:")
        # with the dQ warp freeing the slots, count 1 is the protocol, not a mutation
        bugs = (tuple(b for b in BUGS if b != "Q/dO slot freed by one warpgroup")
                + ("writer frees the slot before the second partial",)) if wr else BUGS
        _bwd.check_mutations(bugs, lambda bug: simulate([(u, rng.randint(1, 5)) for u in range(4)], 2, 2, 2, rng, bug,
                                                        skip, wr))


if __name__ == "__main__":
    main()
