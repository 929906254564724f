"""CPU check of the mbarrier protocols of the warp-specialised backward kernels (gluon_bwd.py): `_attn_bwd_ws` (one
compute partition of 8 warps) and `_attn_bwd_pp` (two compute warpgroups apart), each with a loader warp and a dQ
warp. The partitions are Python generators under a random scheduler, with the forward's simulated mbarriers
(../gluon_fwd/protocol_sim.py: hardware parity semantics) and TMA copies that land at random later times. An
expect-tx barrier is modelled as one arrival for the expect plus one per copy it waits for.

Checked over random interleavings, ring depths and tile counts: nothing deadlocks; a compute partition reads a Q /
dO slot, and the LSE / delta the loader stored beside it, only while the slot holds the tile it expects; the loader
refills a slot (its stats first, then the copies) only after every compute partition has released it; the dQ warp
reduces a dQ tile only once it is written and before it is overwritten, each (partition, tile) exactly once; and each
of five single mutations of the protocol is caught.

The generators mirror the kernels' waits and arrives line for line; a change to the kernels' protocol belongs here
too.

    python results/attention/gluon_bwd/protocol_sim.py        # prints the cases run; raises on a violation
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gluon_fwd"))
from protocol_sim import Barrier, Sim as ForwardSim, check_mutations  # noqa: E402


def kv_halves(n_compute):
    """The K / V tiles the loader copies: whole (ws) or one 64-key half per compute warpgroup (pp)."""
    return [(x, w) for w in range(n_compute) for x in ("k", "v")]


def loader(s, n_tiles, stages, bug):
    s.kv_bar.arrive()  # mbarrier.expect for all the K / V copies
    for buf in kv_halves(s.n_compute):
        s.tma(s.kv_bar, buf, 0)
    for t in range(n_tiles):
        slot = t % stages
        flip = 0 if bug == "loader parity without the flip" else 1
        yield s.empty[slot], ((t // stages) & 1) ^ flip
        s.write(("stats", slot), t)  # gl.store to shared memory: visible at once, released by the expect's arrive
        s.ready[slot].arrive()  # mbarrier.expect
        s.tma(s.ready[slot], ("q", slot), t)
        s.tma(s.ready[slot], ("do", slot), t)


def compute(s, w, n_tiles, stages, dq_stages, bug):
    yield s.kv_bar, 0
    for x in ("k", "v"):
        s.read(w, (x, w), 0)
    for t in range(n_tiles):
        slot = t % stages
        yield s.ready[slot], (t // stages) & 1
        for buf in ("q", "do", "stats"):
            s.read(w, (buf, slot), t)
        s.empty[slot].arrive()
        s.released[w].add(t)
        d = t % dq_stages
        if bug != "compute skips the dQ-empty wait":
            yield s.dq_empty[w][d], ((t // dq_stages) & 1) ^ 1
        s.write_dq(w, d, t)
        s.dq_full[w][d].arrive()


def dq_writer(s, n_tiles, dq_stages, bug):
    for t in range(n_tiles):
        d = t % dq_stages
        for w in range(s.n_compute):
            if not (bug == "writer waits for one partial" and w == 1):
                yield s.dq_full[w][d], (t // dq_stages) & 1
            s.reduce(w, d, t)
        for w in range(s.n_compute):  # after tma.store_wait(0): the TMA unit has read the slots
            s.dq_empty[w][d].arrive()


class Sim(ForwardSim):
    """The forward's scheduler (`run`: copies land at random, partitions run in a random order, a deadlock
    raises) over the backward's barriers and buffers."""

    def __init__(self, n_compute, stages, dq_stages, rng, bug=None):  # the forward's own barriers are not made
        self.rng, self.n_compute = rng, n_compute
        copies = len(kv_halves(n_compute)) // (2 if bug == "kv expect for half the copies" else 1)
        self.kv_bar = Barrier(1 + copies)
        self.ready = [Barrier(3) for _ in range(stages)]  # the expect, the Q copy, the dO copy
        empty_count = 1 if bug == "release count 1" else n_compute
        self.empty = [Barrier(empty_count) for _ in range(stages)]
        self.dq_full = [[Barrier(1) for _ in range(dq_stages)] for _ in range(n_compute)]
        self.dq_empty = [[Barrier(1) for _ in range(dq_stages)] for _ in range(n_compute)]
        self.smem, self.dq, self.in_flight = {}, {}, []
        self.released = [set() for _ in range(n_compute)]
        self.reduced = []

    def _check_free(self, buf):
        old = self.smem.get(buf)
        if buf[0] in ("q", "do", "stats") and old is not None and not all(old in r for r in self.released):
            raise AssertionError(f"loader overwrote {buf} holding tile {old} before every partition released it")

    def write(self, buf, tile):
        self._check_free(buf)
        self.smem[buf] = tile

    def tma(self, bar, buf, tile):
        """A copy into buf, landing later with one arrival on bar (its expect arrived separately)."""
        self._check_free(buf)
        self.in_flight.append((bar, buf, tile))

    def read(self, w, buf, tile):
        if self.smem.get(buf) != tile:
            raise AssertionError(f"partition {w} read {buf} expecting tile {tile}, found {self.smem.get(buf)}")

    def write_dq(self, w, d, tile):
        old = self.dq.get((w, d))
        if old is not None and (w, old) not in self.reduced:
            raise AssertionError(f"partition {w} overwrote dQ slot {d} (tile {old}) before it was reduced")
        self.dq[(w, d)] = tile

    def reduce(self, w, d, tile):
        if self.dq.get((w, d)) != tile:
            raise AssertionError(f"dQ warp reduced slot {d} of partition {w} expecting tile {tile}, "
                                 f"found {self.dq.get((w, d))}")
        self.reduced.append((w, tile))


def simulate(n_compute, stages, dq_stages, n_tiles, rng, bug=None):
    s = Sim(n_compute, stages, dq_stages, rng, bug)
    actors = {"loader": loader(s, n_tiles, stages, bug), "dq": dq_writer(s, n_tiles, dq_stages, bug)}
    for w in range(n_compute):
        actors[f"c{w}"] = compute(s, w, n_tiles, stages, dq_stages, bug)
    s.run(actors)
    want = sorted((w, t) for w in range(n_compute) for t in range(n_tiles))
    if sorted(s.reduced) != want:
        raise AssertionError(f"dQ tiles reduced {sorted(s.reduced)[:6]} ..., want each (partition, tile) once")


MUTATIONS = ["release count 1", "loader parity without the flip", "compute skips the dQ-empty wait",
             "writer waits for one partial", "kv expect for half the copies"]


def main():
    rng = random.Random(0)
    cases = 0
    for n_compute, name in ((1, "ws"), (2, "pp")):
        for stages in (2, 3, 4):
            for dq_stages in (1, 2):
                for n_tiles in (1, 2, 3, 5, 8, 13):
                    for _ in range(60):
                        simulate(n_compute, stages, dq_stages, n_tiles, rng)
                        cases += 1
    print(f"{cases} random interleavings (ws and pp; ring depths 2-4, dQ rings 1-2, 1-13 query tiles): no deadlock, "
          "no stale, overwritten or lost tile")
    check_mutations(MUTATIONS, lambda bug: simulate(2, 2, 2, 5, rng, bug))


if __name__ == "__main__":
    main()
