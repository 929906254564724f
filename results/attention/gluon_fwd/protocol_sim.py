"""CPU check of the ws forward's mbarrier protocol (gluon_fwd.py, `_attn_fwd_ws`): the loader and the two consumers as
Python generators under a random scheduler, mbarriers with hardware semantics (a wait on parity P passes once the
barrier has completed a phase of parity P, i.e. while its completed-phase count has the other parity; a fresh
barrier passes a wait on parity 1), and TMA copies that land at random later times. Checks, over many random
interleavings, tile counts and ring depths: nothing deadlocks; a consumer reads a ring slot only while it holds
the tile it expects; the loader refills a slot only after both consumers released its previous tile; the two
consumers issue their wgmma rounds strictly in turn (0, 1, 0, 1, ...).

The generators mirror the kernel's waits and arrives line for line; a change to the kernel's protocol belongs here
too.

    python results/attention/gluon_fwd/protocol_sim.py        # prints the cases run; raises on a violation
"""
import random


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.phases = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phases = 0, self.phases + 1

    def passes(self, parity):
        return self.phases % 2 != parity


def loader(s, n_tiles, stages):
    for w in range(2):
        s.tma(s.q_bars[w], ("q", w), None)
    for j in range(n_tiles):
        slot = j % stages
        yield s.kv_empty[slot], ((j // stages) & 1) ^ 1
        s.tma(s.k_ready[slot], ("k", slot), j)
        s.tma(s.v_ready[slot], ("v", slot), j)


def consumer(s, w, n_tiles, stages):
    yield s.q_bars[w], 0
    yield s.k_ready[0], 0
    yield s.turns[w], 0
    s.read(w, ("k", 0), 0)
    s.issue(w, 0)
    s.turns[1 - w].arrive()
    for j in range(1, n_tiles):
        slot, prev = j % stages, (j - 1) % stages
        yield s.k_ready[slot], (j // stages) & 1
        yield s.v_ready[prev], ((j - 1) // stages) & 1
        yield s.turns[w], j & 1
        s.read(w, ("k", slot), j)
        s.read(w, ("v", prev), j - 1)
        s.issue(w, j)
        s.turns[1 - w].arrive()
        s.kv_empty[prev].arrive()
        s.released[w].add(j - 1)
    last = (n_tiles - 1) % stages
    yield s.v_ready[last], ((n_tiles - 1) // stages) & 1
    yield s.turns[w], n_tiles & 1
    s.read(w, ("v", last), n_tiles - 1)
    s.issue(w, n_tiles)
    s.turns[1 - w].arrive()
    s.kv_empty[last].arrive()
    s.released[w].add(n_tiles - 1)


class Sim:
    def __init__(self, n_tiles, stages, rng):
        self.rng, self.stages = rng, stages
        self.q_bars = [Barrier(1), Barrier(1)]
        self.turns = [Barrier(1), Barrier(1)]
        self.k_ready = [Barrier(1) for _ in range(stages)]
        self.v_ready = [Barrier(1) for _ in range(stages)]
        self.kv_empty = [Barrier(2) for _ in range(stages)]
        self.turns[0].arrive()  # the kernel's pre-arrival: consumer 0 issues first
        self.smem, self.in_flight, self.rounds, self.released = {}, [], [], [set(), set()]

    def tma(self, bar, buf, tile):
        if buf[0] in "kv":  # the slot's previous tile must be released by both consumers
            old = self.smem.get(buf)
            if old is not None and not all(old in r for r in self.released):
                raise AssertionError(f"loader overwrote {buf} holding tile {old} before both consumers released it")
        self.in_flight.append((bar, buf, tile))

    def read(self, w, buf, tile):
        if self.smem.get(buf) != tile:
            raise AssertionError(f"consumer {w} read {buf} expecting tile {tile}, found {self.smem.get(buf)}")

    def issue(self, w, r):
        self.rounds.append((w, r))

    def run(self, actors):
        waiting = {name: next(gen, None) for name, gen in actors.items()}
        while any(v is not None for v in waiting.values()) or self.in_flight:
            ready = [n for n, v in waiting.items() if v is not None and v[0].passes(v[1])]
            if self.in_flight and (not ready or self.rng.random() < 0.3):  # a copy lands
                bar, buf, tile = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
                self.smem[buf] = tile
                bar.arrive()
                continue
            if not ready:
                raise AssertionError(f"deadlock: {[(n, v[1]) for n, v in waiting.items() if v is not None]}")
            name = self.rng.choice(ready)
            waiting[name] = next(actors[name], None)


def check_mutations(bugs, run, trials=200):
    """Each bug in `bugs` (a protocol mutation) run `trials` times by run(bug): the count that raised AssertionError is
    printed, and one never caught fails, since the simulation would then not test what the mutation breaks."""
    for bug in bugs:
        caught = 0
        for _ in range(trials):
            try:
                run(bug)
            except AssertionError:
                caught += 1
        print(f"mutation '{bug}': caught in {caught} of {trials} runs")
        assert caught > 0, f"the simulation misses the mutation '{bug}'"


def main():
    rng = random.Random(0)
    cases = 0
    for stages in (2, 3):
        for n_tiles in (1, 2, 3, 4, 5, 8, 13):
            for _ in range(200):
                s = Sim(n_tiles, stages, rng)
                s.run({"loader": loader(s, n_tiles, stages), "c0": consumer(s, 0, n_tiles, stages),
                       "c1": consumer(s, 1, n_tiles, stages)})
                want = [(w, r) for r in range(n_tiles + 1) for w in (0, 1)]
                assert s.rounds == want, f"rounds out of turn: {s.rounds[:8]} ..."
                cases += 1
    print(f"{cases} random interleavings (ring depths 2-3, 1-13 key tiles): no deadlock, no stale or overwritten "
          "tile, wgmma rounds strictly alternating")


if __name__ == "__main__":
    main()
