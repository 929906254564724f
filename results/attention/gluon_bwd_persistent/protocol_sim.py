"""The persistent backward's barrier protocol (kernels/flash_gluon.py's `_bwd_loader`, `_bwd_compute` and
`_bwd_dq_writer`), simulated on the CPU with the shipped backward's simulator (../gluon_bwd/protocol_sim.py, itself
on ../gluon_fwd/protocol_sim.py: mbarriers with hardware parity semantics, TMA copies that land at random later
times, a random scheduler). The loader, the compute partition and the
dQ warp are generators that mirror those partitions' waits and arrives line for line, over the key blocks of one
program; a change to the kernel's protocol belongs here too.

Added to the shipped backward's checks: K and V in KV_BUFFERS buffers across key blocks, dK and dV stored through
them by TMA stores that land at random later times. Checked over random interleavings, key-block lists (query-tile
counts equal or varying), ring depths and 1-2 K/V buffers: nothing deadlocks; the compute reads a K/V buffer only
while it holds the key block it expects, and a Q / dO / stats slot only while it holds the query tile it expects;
the loader refills a K/V buffer only after the dK and dV written into it have been stored, and a ring slot only
after it was released; the dQ warp reduces each tile exactly once. Each of five single mutations is caught.

    python results/attention/gluon_bwd_persistent/protocol_sim.py     # prints the cases run; raises on a violation
"""
import importlib.util
import os
import random

# ../gluon_bwd/protocol_sim.py under its own name (it imports ../gluon_fwd/protocol_sim.py as `protocol_sim`)
_spec = importlib.util.spec_from_file_location(
    "gluon_bwd_protocol_sim", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gluon_bwd",
                                           "protocol_sim.py"))
_bwd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bwd)
Barrier, BackwardSim = _bwd.Barrier, _bwd.Sim

BUGS = ("K/V buffer handed back before the store wait", "kv_empty wait without the flip",
        "kv_ready parity per key block, not per buffer use", "no kv_empty arrive", "compute reads buffer 0 always")


class _NoBarrier:
    """What a TMA store lands on: nothing waits for it but `store_wait`."""

    def arrive(self):
        pass


class _StoresDone:
    """A wait that passes once every TMA store the compute partition issued has landed (tma.store_wait(0))."""

    def __init__(self, sim):
        self.sim = sim

    def passes(self, parity):
        return all(self.sim.smem.get(("stored", buf)) == unit for buf, unit in self.sim.pending)


class Sim(BackwardSim):
    """The shipped backward's simulator (one compute partition) plus the K/V buffers and the dK/dV stores."""

    def __init__(self, stages, dq_stages, kv_buffers, rng):
        super().__init__(1, stages, dq_stages, rng)
        self.kv_ready = [Barrier(3) for _ in range(kv_buffers)]  # the expect, the K copy, the V copy
        self.kv_empty = [Barrier(1) for _ in range(kv_buffers)]
        self.pending, self.stores_done = [], _StoresDone(self)

    def tma(self, bar, buf, tile):
        if buf[0] in ("k", "v"):
            old = self.smem.get(buf)
            if old is not None and not (isinstance(old, tuple) and self.smem.get(("stored", buf)) == old[1]):
                raise AssertionError(f"loader overwrote {buf} holding {old} before its dK/dV store landed")
        super().tma(bar, buf, tile)

    def write_result(self, buf, unit):
        """dK or dV into the key block's own K or V buffer, then its TMA store (landing later)."""
        if self.smem.get(buf) != unit:
            raise AssertionError(f"compute wrote its result into {buf}, which holds {self.smem.get(buf)}, not {unit}")
        self.smem[buf] = ("result", unit)
        self.pending.append((buf, unit))
        self.in_flight.append((_NoBarrier(), ("stored", buf), unit))

    def store_wait(self):
        while not self.stores_done.passes(0):
            yield self.stores_done, 0
        self.pending = []


def loader(s, blocks, stages, kv_buffers, bug):
    it = g = 0
    for unit, n_tiles in blocks:
        kb = it % kv_buffers
        flip = 0 if bug == "kv_empty wait without the flip" else 1
        yield s.kv_empty[kb], ((it // kv_buffers) & 1) ^ flip
        s.kv_ready[kb].arrive()  # mbarrier.expect
        s.tma(s.kv_ready[kb], ("k", kb), unit)
        s.tma(s.kv_ready[kb], ("v", kb), unit)
        for _ in range(n_tiles):
            slot = g % stages
            yield s.empty[slot], ((g // stages) & 1) ^ 1
            s.write(("stats", slot), g)
            s.ready[slot].arrive()  # mbarrier.expect
            s.tma(s.ready[slot], ("q", slot), g)
            s.tma(s.ready[slot], ("do", slot), g)
            g += 1
        it += 1


def compute(s, blocks, stages, dq_stages, kv_buffers, bug):
    it = g = 0
    for unit, n_tiles in blocks:
        kb = 0 if bug == "compute reads buffer 0 always" else it % kv_buffers
        parity = (it & 1) if bug == "kv_ready parity per key block, not per buffer use" else (it // kv_buffers) & 1
        yield s.kv_ready[kb], parity
        for j in range(n_tiles):
            slot = g % stages
            yield s.ready[slot], (g // stages) & 1
            for x in ("k", "v"):
                s.read(0, (x, kb), unit)
            for buf in ("q", "do", "stats"):
                s.read(0, (buf, slot), g)
            s.empty[slot].arrive()
            s.released[0].add(g)
            if kv_buffers > 1 and j == 0 and it > 0:
                if bug != "K/V buffer handed back before the store wait":
                    yield from s.store_wait()
                if bug != "no kv_empty arrive":
                    s.kv_empty[(it - 1) % kv_buffers].arrive()
            d = g % dq_stages
            yield s.dq_empty[0][d], ((g // dq_stages) & 1) ^ 1
            s.write_dq(0, d, g)
            s.dq_full[0][d].arrive()
            g += 1
        for x in ("k", "v"):
            s.write_result((x, kb), unit)
        if kv_buffers == 1:
            if bug != "K/V buffer handed back before the store wait":
                yield from s.store_wait()
            if bug != "no kv_empty arrive":
                s.kv_empty[0].arrive()
        it += 1
    yield from s.store_wait()


def simulate(blocks, stages, dq_stages, kv_buffers, rng, bug=None):
    s = Sim(stages, dq_stages, kv_buffers, rng)
    s.run({"loader": loader(s, blocks, stages, kv_buffers, bug),
           "compute": compute(s, blocks, stages, dq_stages, kv_buffers, bug),
           # the dQ warp's ring runs on across key blocks: the shipped backward's, over all their query tiles
           "dq": _bwd.dq_writer(s, sum(t for _, t in blocks), dq_stages, None)})
    n = sum(t for _, t in blocks)
    if sorted(s.reduced) != [(0, t) for t in range(n)]:
        raise AssertionError("dQ tiles not each reduced once")
    if s.pending:  # the compute's last store_wait returned only once every store had landed
        raise AssertionError(f"dK/dV stores never waited for: {s.pending}")


def main():
    rng = random.Random(0)
    cases = 0
    for kv_buffers in (1, 2):
        for stages in (2, 3, 4):
            for dq_stages in (1, 2):
                for _ in range(150):
                    n_blocks = rng.randint(1, 6)
                    causal = rng.random() < 0.5
                    blocks = [(u, rng.randint(1, 8) if causal else 4) for u in range(n_blocks)]
                    simulate(blocks, stages, dq_stages, kv_buffers, rng)
                    cases += 1
    print(f"{cases} random interleavings (1-6 key blocks of 1-8 query tiles, ring depths 2-4, dQ rings 1-2, 1-2 K/V "
          "buffers): no deadlock, no stale or overwritten tile or buffer, each dQ tile reduced once")
    _bwd.check_mutations(BUGS, lambda bug: simulate([(u, rng.randint(1, 5)) for u in range(4)], 2, 2, 2, rng, bug))


if __name__ == "__main__":
    main()
