"""The Gluon forward's barrier protocol across work items (kernels/flash_gluon.py `_loader`, `_consumer`: the persistent
form shipped in session 34), simulated on the CPU with the simulator written for the one-item-a-program forward before
it (../gluon_fwd/protocol_sim.py: mbarriers with hardware parity semantics, TMA copies that land at random later
times, a random scheduler). The loader and the two consumers are generators that mirror the kernel's waits and
arrives line for line, over the work items of one program (a causal pair of query tiles is two items of different
lengths); a change to the kernel's protocol belongs here too.

Checked over random interleavings, item lists (equal or varying key tiles), ring depths and Q buffer counts: nothing
deadlocks; a consumer reads a Q buffer or K/V slot only while it holds the tile it expects; the loader refills a K/V
slot only after both consumers released its tile, and a Q buffer only after its consumer stored that item's O; the
consumers' wgmma rounds alternate strictly, across items too. Each of five single mutations of the protocol is
caught. With EXP_TURNS (session 38, shipped at head dim 64 non-causal) the turns bracket each round's exponentials
instead of its wgmma issues, one a key tile: the same checks, the exponential phases alternating strictly. With
NAMED_TURNS (session 39, prepared: ../gluon_fwd_named/) the turns are two hardware named barriers for 256 threads,
consumer w waiting on barrier w with bar.sync and passing with bar.arrive on the other's, consumer 1 arriving once
first: the same checks, plus that no consumer arrives twice on one barrier before its waiter has come (a second
arrive would complete the barrier without the waiter). With K_AHEAD (session 45, shipped at head dim 256:
../gluon_fwd_k_ahead/) each K slot has its own release, k_empty, arrived when a consumer's S is done with it, V keeps
kv_empty, and the loader loads K(j) before V(j - 1): the same checks, with the loader refilling a K slot only after
both consumers released its K and a V slot only after both released its V.

    python results/attention/gluon_persistent/protocol_sim.py     # prints the cases run; raises on a violation
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gluon_fwd"))
from protocol_sim import Barrier, Sim as ForwardSim  # noqa: E402

BUGS = ("q_ready parity per item, not per buffer use", "q_empty wait without the flip",
        "v_ready parity of the wrong tile", "no q_empty arrive", "no kv_empty arrive")
NAMED_BUGS = ("no first named arrive", "a second pass on the last round")
K_AHEAD_BUGS = ("no k_empty arrive", "k_empty wait without the flip", "k_empty arrive before S")


class NamedBarrier:
    """A hardware named barrier for the two consumer warpgroups (bar.sync / bar.arrive, 256 threads): a generation
    completes once both have come, the waiter by bar.sync (blocking until then), the other by bar.arrive (never
    blocking). One warpgroup coming twice in a generation would complete it on its own: an error here."""

    def __init__(self):
        self.members, self.generation = set(), 0

    def join(self, w):
        if w in self.members:
            raise AssertionError(f"consumer {w} came twice to a named barrier in one generation")
        gen = self.generation
        self.members.add(w)
        if len(self.members) == 2:
            self.members, self.generation = set(), self.generation + 1
        return gen

    def passes(self, gen):  # the Sim's wait interface: a bar.sync that joined generation gen
        return self.generation > gen


class Sim(ForwardSim):
    """The forward's simulator plus the persistent kernel's Q buffers: q_ready / q_empty per (buffer, consumer)."""

    def __init__(self, stages, q_buffers, rng):
        super().__init__(0, stages, rng)
        self.q_ready = [Barrier(1) for _ in range(2 * q_buffers)]
        self.q_empty = [Barrier(1) for _ in range(2 * q_buffers)]
        self.q_done = set()  # (item, consumer) whose O has left its Q buffer
        self.named = [NamedBarrier(), NamedBarrier()]  # NAMED_TURNS: consumer w waits on named[w]
        self.k_empty = [Barrier(2) for _ in range(stages)]  # K_AHEAD
        self.released_k = [set(), set()]  # K tiles each consumer is done with (with V's unless K_AHEAD)

    def tma(self, bar, buf, tile):
        if buf[0] == "q":
            old = self.smem.get(buf)
            if old is not None and old not in self.q_done:
                raise AssertionError(f"loader overwrote {buf} holding {old} before its O was stored")
        if buf[0] == "k":
            old = self.smem.get(buf)
            if old is not None and not all(old in r for r in self.released_k):
                raise AssertionError(f"loader overwrote {buf} holding K tile {old} before both consumers' S was done")
            self.in_flight.append((bar, buf, tile))
            return
        super().tma(bar, buf, tile)


def loader(s, items, stages, q_buffers, bug, k_ahead=False):
    it = g = 0

    def load_v(gv):  # K_AHEAD's V(j - 1), behind K(j)
        slot = gv % stages
        yield s.kv_empty[slot], ((gv // stages) & 1) ^ 1
        s.tma(s.v_ready[slot], ("v", slot), gv)

    for item, n_tiles in items:
        qb = it % q_buffers
        for w in range(2):
            flip = 0 if bug == "q_empty wait without the flip" else 1
            yield s.q_empty[2 * qb + w], ((it // q_buffers) & 1) ^ flip
            s.tma(s.q_ready[2 * qb + w], ("q", 2 * qb + w), (item, w))
        for j in range(n_tiles):
            slot = g % stages
            if k_ahead:
                flip = 0 if bug == "k_empty wait without the flip" else 1
                yield s.k_empty[slot], ((g // stages) & 1) ^ flip
                s.tma(s.k_ready[slot], ("k", slot), g)
                if j > 0:
                    yield from load_v(g - 1)
            else:
                yield s.kv_empty[slot], ((g // stages) & 1) ^ 1
                s.tma(s.k_ready[slot], ("k", slot), g)
                s.tma(s.v_ready[slot], ("v", slot), g)
            g += 1
        if k_ahead:  # the item's last V
            yield from load_v(g - 1)
        it += 1


def consumer(s, w, items, stages, q_buffers, bug, exp_turns=False, named=False, k_ahead=False):
    it = g = tc = 0

    def release_k(slot, tile):  # K_AHEAD: S is done with K's tile (else K goes with V, after P V)
        if bug != "no k_empty arrive":
            s.k_empty[slot].arrive()
        s.released_k[w].add(tile)

    def release_kv(slot, tile):
        if bug != "no kv_empty arrive":
            s.kv_empty[slot].arrive()
        s.released[w].add(tile)
        if not k_ahead:
            s.released_k[w].add(tile)

    def wait_turn():
        nonlocal tc
        if named:
            yield s.named[w], s.named[w].join(w)  # bar.sync
        else:
            yield s.turns[w], tc & 1
        tc += 1

    def pass_turn():
        s.issue(w, tc)
        if named:
            s.named[1 - w].join(w)  # bar.arrive
        else:
            s.turns[1 - w].arrive()

    if named and w == 1 and bug != "no first named arrive":
        s.named[0].join(1)  # consumer 0 goes first

    for item, n_tiles in items:
        qi = 2 * (it % q_buffers) + w
        yield s.q_ready[qi], (it & 1) if bug == "q_ready parity per item, not per buffer use" else ((it // q_buffers) & 1)
        s.read(w, ("q", qi), (item, w))
        slot = g % stages
        yield s.k_ready[slot], (g // stages) & 1
        if k_ahead and bug == "k_empty arrive before S":
            release_k(slot, g)
        if not exp_turns:  # S(0) issued in turn
            yield from wait_turn()
        s.read(w, ("k", slot), g)
        if not exp_turns:
            pass_turn()
        if k_ahead and bug != "k_empty arrive before S":  # S(0) waited for
            release_k(slot, g)
        if exp_turns:  # S(0)'s exponentials in turn
            yield from wait_turn()
            pass_turn()
        for j in range(1, n_tiles):
            gj = g + j
            slot, prev = gj % stages, (gj - 1) % stages
            yield s.k_ready[slot], (gj // stages) & 1
            yield s.v_ready[prev], ((gj - (0 if bug == "v_ready parity of the wrong tile" else 1)) // stages) & 1
            if not exp_turns:  # S(j) and P(j-1) V(j-1) issued in turn
                yield from wait_turn()
            s.read(w, ("k", slot), gj)
            s.read(w, ("v", prev), gj - 1)
            if not exp_turns:
                pass_turn()
            if k_ahead:  # S(j) waited for
                release_k(slot, gj)
            if exp_turns:  # S(j)'s exponentials in turn
                yield from wait_turn()
                pass_turn()
            release_kv(prev, gj - 1)
        glast = g + n_tiles - 1
        last = glast % stages
        yield s.v_ready[last], (glast // stages) & 1
        if not exp_turns:  # the last P V issued in turn; with exp_turns it has no exponentials, so no turn
            yield from wait_turn()
        s.read(w, ("v", last), glast)
        if not exp_turns:
            pass_turn()
        if named and bug == "a second pass on the last round":
            s.named[1 - w].join(w)
        release_kv(last, glast)
        s.q_done.add((item, w))  # O stored through the Q buffer and tma.store_wait: the buffer is free
        if bug != "no q_empty arrive":
            s.q_empty[qi].arrive()
        g += n_tiles
        it += 1


def simulate(items, stages, q_buffers, rng, bug=None, exp_turns=False, named=False, k_ahead=False):
    s = Sim(stages, q_buffers, rng)
    s.run({"loader": loader(s, items, stages, q_buffers, bug, k_ahead),
           "c0": consumer(s, 0, items, stages, q_buffers, bug, exp_turns, named, k_ahead),
           "c1": consumer(s, 1, items, stages, q_buffers, bug, exp_turns, named, k_ahead)})
    rounds = sum(n + (0 if exp_turns else 1) for _, n in items)
    want = [(w, r) for r in range(1, rounds + 1) for w in (0, 1)]
    assert s.rounds == want, f"rounds out of turn: {s.rounds[:8]} ..."


def assert_caught(bug, **forms):
    """Simulate the mutation `bug` (with these `simulate` forms) over 50 seeds; raise unless one of them fails."""
    try:
        for seed in range(50):
            simulate([(t, 1 + (seed + t) % 4) for t in range(5)], 2, 2, random.Random(seed), bug, seed % 2 == 1,
                     **forms)
    except AssertionError:
        return
    raise AssertionError(f"mutation not caught: {bug}")


def main():
    rng = random.Random(0)
    cases = 0
    for seed in range(300):
        n_items = rng.randint(1, 7)
        causal = seed % 2 == 1
        items = [(t, rng.randint(1, 9) if causal else 5) for t in range(n_items)]
        for stages in (2, 3, 4):
            for q_buffers in (1, 2):
                for exp_turns in (False, True):
                    for named in (False, True):
                        for k_ahead in (False, True):
                            simulate(items, stages, q_buffers, rng, exp_turns=exp_turns, named=named, k_ahead=k_ahead)
                            cases += 1
    # each mutation, on the main protocol, the named barriers' own and K_AHEAD's release of K
    for bug in BUGS:
        assert_caught(bug)
    for bug in NAMED_BUGS:
        assert_caught(bug, named=True)
    for bug in K_AHEAD_BUGS:
        assert_caught(bug, k_ahead=True)
    mutations = len(BUGS) + len(NAMED_BUGS) + len(K_AHEAD_BUGS)
    print(f"{cases} random interleavings (1-7 items of 1-9 key tiles, ring depths 2-4, 1-2 Q buffers, turns around the "
          f"wgmma issues or the exponentials, through mbarriers or named barriers, K released with V or after S): no "
          f"deadlock, no stale or overwritten tile, turns strictly alternating; all {mutations} mutations caught")


if __name__ == "__main__":
    main()
