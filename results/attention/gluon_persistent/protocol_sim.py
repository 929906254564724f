"""The persistent forward's barrier protocol, simulated on the CPU: the loader and the two consumers of one program
as Python generators that use persistent.py's index arithmetic, under a random interleaving, with mbarrier parity
semantics and TMA copies that land after a random delay.

Checked at every step: a consumer reads the Q, K and V it expects (buffers are tagged with what was loaded into
them); the loader never overwrites a buffer a consumer has not released; the consumers' matmuls alternate; and the
run ends with every item done, not in a deadlock. The Gluon kernel itself cannot run here, so this checks the
protocol as written in persistent.py, transcribed by hand (keep the two in step).

    python results/attention/gluon_persistent/protocol_sim.py     # ~10 s: many seeds, item lists and configs
"""
import random


class Barrier:
    """mbarrier: `count` arrivals complete a phase; wait(parity) passes once the phase of that parity completed,
    i.e. while the current phase's parity differs (a fresh barrier passes parity 1 at once)."""

    def __init__(self, count):
        self.count, self.arrived, self.phase = count, 0, 0

    def arrive(self):
        self.arrived += 1
        assert self.arrived <= self.count
        if self.arrived == self.count:
            self.arrived, self.phase = 0, self.phase + 1

    def passes(self, parity):
        return (self.phase & 1) != parity


class Sim:
    def __init__(self, rng, items, stages, q_buffers):
        self.rng, self.items, self.stages, self.qb = rng, items, stages, q_buffers
        self.q_ready = [Barrier(1) for _ in range(2 * q_buffers)]
        self.q_empty = [Barrier(1) for _ in range(2 * q_buffers)]
        self.turns = [Barrier(1), Barrier(1)]
        self.k_ready = [Barrier(1) for _ in range(stages)]
        self.v_ready = [Barrier(1) for _ in range(stages)]
        self.kv_empty = [Barrier(2) for _ in range(stages)]
        self.q_smem = [None] * (2 * q_buffers)  # tag of what the buffer holds: ("Q", item, w) or ("O", item, w)
        self.k_smem = [None] * stages
        self.v_smem = [None] * stages
        self.q_busy = [False] * (2 * q_buffers)  # a consumer still reads / stores through it
        self.kv_readers = [0] * stages  # consumers still to release the slot
        self.pending = []  # (steps left, barrier, buffer list, index, tag): TMA loads in flight
        self.last_turn = None
        self.turns[0].arrive()

    def tma_load(self, bar, buf, i, tag):
        self.pending.append([self.rng.randint(0, 6), bar, buf, i, tag])

    def tick(self):
        for p in list(self.pending):
            p[0] -= 1
            if p[0] < 0:
                _, bar, buf, i, tag = p
                buf[i] = tag
                bar.arrive()
                self.pending.remove(p)

    # ---- the partitions, as in persistent.py -----------------------------------------------------------------
    def loader(self):
        it = g = 0
        for item, n_tiles in self.items:
            qb = it % self.qb
            for w in range(2):
                yield self.q_empty[2 * qb + w], ((it // self.qb) & 1) ^ 1
                assert not self.q_busy[2 * qb + w], "loader overwrites a Q buffer still in use"
                self.tma_load(self.q_ready[2 * qb + w], self.q_smem, 2 * qb + w, ("Q", item, w))
            for j in range(n_tiles):
                slot = g % self.stages
                yield self.kv_empty[slot], ((g // self.stages) & 1) ^ 1
                assert self.kv_readers[slot] == 0, "loader overwrites a K/V slot still in use"
                self.kv_readers[slot] = 2
                self.tma_load(self.k_ready[slot], self.k_smem, slot, ("K", item, j))
                self.tma_load(self.v_ready[slot], self.v_smem, slot, ("V", item, j))
                g += 1
            it += 1

    def consumer(self, w):
        it = g = tc = 0
        my_turn, other_turn = self.turns[w], self.turns[1 - w]
        for item, n_tiles in self.items:
            qi = 2 * (it % self.qb) + w
            yield self.q_ready[qi], (it // self.qb) & 1
            assert self.q_smem[qi] == ("Q", item, w), (self.q_smem[qi], item, w)
            self.q_busy[qi] = True
            slot = g % self.stages
            yield self.k_ready[slot], (g // self.stages) & 1
            yield my_turn, tc & 1
            tc += 1
            self.mma(w, ("K", item, 0), self.k_smem[slot])
            other_turn.arrive()
            for j in range(1, n_tiles):
                gj = g + j
                slot, prev = gj % self.stages, (gj - 1) % self.stages
                yield self.k_ready[slot], (gj // self.stages) & 1
                yield self.v_ready[prev], ((gj - 1) // self.stages) & 1
                yield my_turn, tc & 1
                tc += 1
                self.mma(w, ("K", item, j), self.k_smem[slot])
                assert self.v_smem[prev] == ("V", item, j - 1), (self.v_smem[prev], item, j - 1)
                other_turn.arrive()
                self.kv_readers[prev] -= 1
                self.kv_empty[prev].arrive()
            glast = g + n_tiles - 1
            last = glast % self.stages
            yield self.v_ready[last], (glast // self.stages) & 1
            yield my_turn, tc & 1
            tc += 1
            assert self.v_smem[last] == ("V", item, n_tiles - 1)
            self.take_turn(w)
            other_turn.arrive()
            self.kv_readers[last] -= 1
            self.kv_empty[last].arrive()
            self.q_smem[qi] = ("O", item, w)  # the epilogue stores O through the Q buffer, then waits for the store
            self.q_busy[qi] = False
            self.q_empty[qi].arrive()
            self.done[w].append(item)
            g += n_tiles
            it += 1

    def mma(self, w, want_k, k_tag):
        assert k_tag == want_k, (k_tag, want_k)
        self.take_turn(w)

    def take_turn(self, w):
        assert self.last_turn != w, "the consumers' matmuls did not alternate"
        self.last_turn = w

    def run(self):
        self.done = [[], []]
        parts = [self.loader(), self.consumer(0), self.consumer(1)]
        waiting = [next(p) for p in parts]  # each partition's current (barrier, parity)
        live = [True] * 3
        for _ in range(10**6):
            runnable = [i for i in range(3) if live[i] and waiting[i][0].passes(waiting[i][1])]
            if not runnable:
                if not any(live) and not self.pending:
                    break
                if not self.pending:
                    raise AssertionError(f"deadlock: live {live}, waiting on phases "
                                         f"{[(w[0].phase, w[1]) if w else None for w in waiting]}")
                self.tick()
                continue
            i = self.rng.choice(runnable)
            try:
                waiting[i] = next(parts[i])
            except StopIteration:
                live[i], waiting[i] = False, None
            if self.rng.random() < 0.5:
                self.tick()
        want = [item for item, _ in self.items]
        assert self.done == [want, want], self.done


def main():
    runs = 0
    for seed in range(300):
        rng = random.Random(seed)
        n_items = rng.randint(1, 7)
        causal = rng.random() < 0.5
        items = [(t, rng.randint(1, 9) if causal else 5) for t in range(n_items)]
        for stages in (2, 3, 4):
            for q_buffers in (1, 2):
                Sim(random.Random(seed * 31 + stages * 7 + q_buffers), items, stages, q_buffers).run()
                runs += 1
    print(f"protocol_sim: {runs} runs, every item done, no deadlock, no overwrite, reads as expected")


if __name__ == "__main__":
    main()
