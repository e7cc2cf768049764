"""The mbarrier protocol of linear/gemm_ws_gluon.py, simulated on the CPU (Gluon kernels do not run in the
interpreter): its producer and consumer, restated step for step as Python generators over model mbarriers with
PTX's phase-parity semantics, interleaved in random orders. Checks: no deadlock; the consumer reads every stage only
after the producer's copy for that very (tile, K step) landed; the producer never overwrites a stage whose wgmma
may still read it; every program walks the tiles pid, pid + NPROG, ... . A change to the kernel's ring positions,
parities or releases must be mirrored here (the restatement is the spec of the handshake). The same for the K / V
ring of attention/prefill_gluon.py (two consumers of every stage: `empty` counts 2)."""

from __future__ import annotations

import random

import pytest


class MBarrier:
    """count-1 mbarrier: `phase` completed phases so far; try_wait(parity) passes when the phase with that parity
    is complete, i.e. the current (incomplete) phase's parity differs (PTX mbarrier.try_wait.parity)."""

    def __init__(self):
        self.phase = 0

    def complete(self):
        self.phase += 1

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity


def producer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log):
    it = 0
    for t in range(pid, tiles, nprog):
        for kk in range(k_tiles):
            s = it % S
            while not empty[s].passes(((it // S) & 1) ^ 1):
                yield "wait empty"
            assert ring[s]["reading"] is None, f"producer overwrites stage {s} while wgmma {ring[s]} reads it"
            ring[s]["data"] = (t, kk)  # expect + TMA copies; the copy lands, then `ready` completes
            yield "copy issued"
            ready[s].complete()
            log.append(("load", t, kk))
            it += 1


def consumer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log, first=0, step=1, turn=None, skip_other=True):
    """`_consumer` with FIRST / STEP: step 2 is the ping-pong kernel's pair, consumer `first` taking the program's
    tiles first, first + 2, ... and skipping the other's ring positions; `turn` (two barriers; None: the mutation
    without them) orders the pair's main loops: consumer c starts its i-th tile after the other finished the main
    loop of the tile before (else the one ahead waits on ring positions a whole tile beyond the producer, where a
    parity wait cannot tell phase j from phase j - 2)."""
    it = first * k_tiles
    in_flight = []  # stages whose wgmma may still read shared memory
    for i, t in enumerate(range(pid + first * nprog, tiles, step * nprog)):
        if step > 1 and turn is not None and (first == 1 or i > 0):
            parity = (i & 1) if first == 1 else ((i - 1) & 1)
            while not turn[first].passes(parity):
                yield "wait turn"
        for kk in range(k_tiles):
            s = it % S
            while not ready[s].passes((it // S) & 1):
                yield "wait ready"
            assert ring[s]["data"] == (t, kk), f"consumer reads stage {s} = {ring[s]['data']}, wants {(t, kk)}"
            ring[s]["reading"] = (t, kk)
            in_flight.append(s)
            yield "wgmma issued"
            # warpgroup_mma_wait(1): all but this step's wgmma finished
            for done in in_flight[:-1]:
                ring[done]["reading"] = None
            in_flight = in_flight[-1:]
            if kk > 0:
                empty[(it - 1) % S].complete()
            it += 1
        if step > 1 and turn is not None:
            turn[1 - first].complete()  # the main loop is done: the other consumer's turn
        for done in in_flight:  # warpgroup_mma_wait(0)
            ring[done]["reading"] = None
        in_flight = []
        empty[(it - 1) % S].complete()  # the tile's last stage back to the producer
        it += (step - 1) * k_tiles if skip_other else 0
        log.append(("tile", t))
        yield "epilogue"


def _run(gens, rng, what):
    live, stalls = list(gens), 0
    while live:
        g = rng.choice(live)
        try:
            step = next(g)
        except StopIteration:
            live.remove(g)
            continue
        stalls = stalls + 1 if step.startswith("wait") else 0
        assert stalls < 10_000, f"deadlock: every side waiting ({what})"


@pytest.mark.parametrize("S", [2, 3, 4])
@pytest.mark.parametrize("tiles,nprog", [(1, 1), (5, 5), (7, 3), (9, 2)])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 7])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("consumers", [1, 2], ids=["ws", "pingpong"])
def test_ring_protocol(S, tiles, nprog, k_tiles, seed, consumers):
    rng = random.Random(seed * 1000 + S * 100 + tiles * 10 + k_tiles + consumers * 7)
    for pid in range(nprog):
        empty, ready = [MBarrier() for _ in range(S)], [MBarrier() for _ in range(S)]
        ring = [{"data": None, "reading": None} for _ in range(S)]
        log: list = []
        gens = [producer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log)]
        turn = [MBarrier(), MBarrier()]
        gens += [consumer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log, first=c, step=consumers, turn=turn)
                 for c in range(consumers)]
        _run(gens, rng, f"S {S}, tiles {tiles}, k {k_tiles}, consumers {consumers}")
        mine = list(range(pid, tiles, nprog))
        # each consumer finishes its own tiles in order; together every tile of the program once
        for c in range(consumers):
            theirs = [e[1] for e in log if e[0] == "tile" and mine.index(e[1]) % consumers == c]
            assert theirs == mine[c::consumers]
        assert sorted(e[1] for e in log if e[0] == "tile") == mine
        assert sorted(e[1:] for e in log if e[0] == "load") == [(t, k) for t in mine for k in range(k_tiles)]


def test_the_simulation_catches_a_wrong_parity():
    """The simulation is not vacuous: the producer waiting on `empty` without the flipped parity of a fresh barrier
    deadlocks at once, and a consumer that frees a stage before its wgmma finished lets the producer overwrite it."""
    S, k_tiles = 2, 4
    empty, ready = [MBarrier() for _ in range(S)], [MBarrier() for _ in range(S)]
    assert not empty[0].passes(0) and empty[0].passes(1)  # fresh: "phase -1 complete" has parity 1
    ring = [{"data": None, "reading": None} for _ in range(S)]
    ring[0]["reading"] = (0, 0)
    with pytest.raises(AssertionError, match="overwrites"):
        next(producer(0, 1, 1, k_tiles, S, empty, ready, ring, []))


@pytest.mark.parametrize("mutation", ["no skip", "no turns"])
def test_the_simulation_catches_a_broken_pingpong_pair(mutation):
    """Without stepping its ring position past the other warpgroup's tile, a ping-pong consumer waits on positions
    of the wrong tile; without the turn barriers one runs a tile ahead of the producer and a parity wait passes on
    an old phase (both seen in this simulation before the kernel had its turns): it reads another tile's data or
    deadlocks."""
    S, k_tiles, tiles = 2, 7, 9
    failures = 0
    for seed in range(4):
        empty, ready = [MBarrier() for _ in range(S)], [MBarrier() for _ in range(S)]
        ring = [{"data": None, "reading": None} for _ in range(S)]
        log: list = []
        gens = [producer(0, 1, tiles, k_tiles, S, empty, ready, ring, log)]
        gens += [consumer(0, 1, tiles, k_tiles, S, empty, ready, ring, log, first=c, step=2,
                          turn=None if mutation == "no turns" else [MBarrier(), MBarrier()],
                          skip_other=mutation != "no skip") for c in range(2)]
        try:
            _run(gens, random.Random(seed), "mutated ping-pong")
        except AssertionError as e:
            assert "reads stage" in str(e) or "deadlock" in str(e)
            failures += 1
    assert failures > 0


class CountedBarrier(MBarrier):
    """An mbarrier initialised with count `count`: a phase completes after that many arrivals."""

    def __init__(self, count: int):
        super().__init__()
        self.count, self.pending = count, count

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.pending = self.count
            self.complete()


def attention_producer(n, S, empty, ready, ring, log):
    """attention/prefill_gluon._producer's K / V ring: tile i into stage i % S."""
    for i in range(n):
        s = i % S
        while not empty[s].passes(((i // S) & 1) ^ 1):
            yield "wait empty"
        assert not ring[s]["readers"], f"producer overwrites stage {s} while consumers {ring[s]['readers']} read it"
        ring[s]["data"] = i
        yield "copy issued"
        ready[s].complete()
        log.append(("load", i))


def attention_consumer(c, n, S, empty, ready, ring, log, overlap, n_mine=None, wait_skipped=True, turn=None,
                       n_pair=0):
    """attention/prefill_gluon._consumer: every tile of the block in order; with `overlap` the next tile's stage is
    acquired (its Q Kᵀ issued) before the current one is released, so a consumer holds two stages at once. The
    trimmed form (CAUSAL_TRIM) computes tiles 0..n_mine-1 and only releases the rest, each after waiting `ready`
    (`wait_skipped=False`: the mutation that releases them at once). `turn` (two count-1 barriers, PINGPONG): for
    tiles below n_pair each wgmma issue (Q Kᵀ, then P V) waits this warpgroup's turn and passes it on."""
    n_mine = n if n_mine is None else n_mine
    log_issue = []

    def issue(i, k):  # the k-th wgmma issue of this warpgroup, in turns while both compute
        if turn is not None and i < n_pair:
            parity = k & 1 if c == 1 else (k - 1) & 1
            while (c == 1 or k > 0) and not turn[c].passes(parity):
                yield "wait turn"
            log.append(("issue", c, k))
            turn[1 - c].complete()
        log_issue.append(k)
    def acquire(i):
        s = i % S
        while not ready[s].passes((i // S) & 1):
            yield "wait ready"
        assert ring[s]["data"] == i, f"consumer {c} reads stage {s} = {ring[s]['data']}, wants tile {i}"
        ring[s]["readers"].add(c)

    def release(i):
        ring[i % S]["readers"].discard(c)
        empty[i % S].arrive()

    if n_mine:
        yield from acquire(0)
    for i in range(n_mine):
        if overlap and i + 1 < n_mine:
            yield from acquire(i + 1)
        yield from issue(i, 2 * i)  # Q Kᵀ
        yield "softmax"
        yield from issue(i, 2 * i + 1)  # P V
        yield "P V done"
        release(i)
        log.append((c, i))
        if not overlap and i + 1 < n_mine:
            yield from acquire(i + 1)
    for i in range(n_mine, n):
        while wait_skipped and not ready[i % S].passes((i // S) & 1):
            yield "wait ready"
        empty[i % S].arrive()
        yield "released unread"


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 5, 9])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_ring_two_consumers_of_every_stage(S, n, overlap, seed):
    """attention/prefill_gluon.py's ring: `empty` counts 2 (both consumer warpgroups read every K / V stage); no
    deadlock, no overwrite while either still reads, each consumer sees tiles 0..n-1 in order, with and without the
    overlap form's two stages held at once."""
    empty, ready = [CountedBarrier(2) for _ in range(S)], [MBarrier() for _ in range(S)]
    ring = [{"data": None, "readers": set()} for _ in range(S)]
    log: list = []
    gens = [attention_producer(n, S, empty, ready, ring, log)]
    gens += [attention_consumer(c, n, S, empty, ready, ring, log, overlap) for c in range(2)]
    _run(gens, random.Random(seed * 100 + S * 10 + n), f"attention S {S} n {n} overlap {overlap}")
    for c in range(2):
        assert [e[1] for e in log if e[0] == c] == list(range(n))


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("n,skip", [(2, 1), (5, 1), (9, 2), (3, 3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_ring_with_a_trimmed_consumer(S, n, skip, seed):
    """CAUSAL_TRIM: warpgroup 0 computes the block's first n - skip tiles and releases the rest unread (each after
    its `ready`), warpgroup 1 computes every tile; no deadlock or overwrite, each sees its tiles in order."""
    empty, ready = [CountedBarrier(2) for _ in range(S)], [MBarrier() for _ in range(S)]
    ring = [{"data": None, "readers": set()} for _ in range(S)]
    log: list = []
    gens = [attention_producer(n, S, empty, ready, ring, log),
            attention_consumer(0, n, S, empty, ready, ring, log, False, n_mine=n - skip),
            attention_consumer(1, n, S, empty, ready, ring, log, False)]
    _run(gens, random.Random(seed * 100 + S * 10 + n), f"trimmed attention S {S} n {n} skip {skip}")
    assert [e[1] for e in log if e[0] == 0] == list(range(n - skip))
    assert [e[1] for e in log if e[0] == 1] == list(range(n))


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("n,skip", [(1, 0), (2, 1), (5, 1), (9, 2), (4, 0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_ring_pingpong_turns(S, n, skip, seed):
    """PINGPONG: the warpgroups' wgmma issues alternate (0's k-th, 1's k-th, 0's (k+1)-th, ...) over the tiles both
    compute, warpgroup 1 runs its extra tiles alone; with the K / V ring no deadlock, no overwrite."""
    empty, ready = [CountedBarrier(2) for _ in range(S)], [MBarrier() for _ in range(S)]
    ring = [{"data": None, "readers": set()} for _ in range(S)]
    turn = [MBarrier(), MBarrier()]
    log: list = []
    pair = n - skip
    gens = [attention_producer(n, S, empty, ready, ring, log),
            attention_consumer(0, n, S, empty, ready, ring, log, False, n_mine=pair, turn=turn, n_pair=pair),
            attention_consumer(1, n, S, empty, ready, ring, log, False, turn=turn, n_pair=pair)]
    _run(gens, random.Random(seed * 100 + S * 10 + n), f"ping-pong attention S {S} n {n} skip {skip}")
    issues = [e[1:] for e in log if e[0] == "issue"]
    assert issues == [(c, k) for k in range(2 * pair) for c in (0, 1)], issues
    assert [e[1] for e in log if e[0] == 1] == list(range(n))


def test_the_attention_simulation_catches_turns_past_the_pair():
    """Warpgroup 1 waiting for turns on the tiles warpgroup 0 never computes (n_pair too large) deadlocks."""
    S, n = 2, 5
    empty, ready = [CountedBarrier(2) for _ in range(S)], [MBarrier() for _ in range(S)]
    ring = [{"data": None, "readers": set()} for _ in range(S)]
    turn = [MBarrier(), MBarrier()]
    gens = [attention_producer(n, S, empty, ready, ring, []),
            attention_consumer(0, n, S, empty, ready, ring, [], False, n_mine=4, turn=turn, n_pair=5),
            attention_consumer(1, n, S, empty, ready, ring, [], False, turn=turn, n_pair=5)]
    with pytest.raises(AssertionError, match="deadlock"):
        _run(gens, random.Random(0), "turns past the pair")


def test_the_attention_simulation_catches_releases_before_ready():
    """Releasing the trimmed tiles without waiting `ready` counts those arrivals toward an earlier release: the
    producer overwrites a stage the other warpgroup still reads, or the phases drift until every side waits."""
    S, n = 2, 6
    failures = 0
    for seed in range(20):
        empty, ready = [CountedBarrier(2) for _ in range(S)], [MBarrier() for _ in range(S)]
        ring = [{"data": None, "readers": set()} for _ in range(S)]
        gens = [attention_producer(n, S, empty, ready, ring, []),
                attention_consumer(0, n, S, empty, ready, ring, [], False, n_mine=3, wait_skipped=False),
                attention_consumer(1, n, S, empty, ready, ring, [], False)]
        try:
            _run(gens, random.Random(seed), "trimmed, released before ready")
        except AssertionError as e:
            assert "overwrites" in str(e) or "reads stage" in str(e) or "deadlock" in str(e), e
            failures += 1
    assert failures > 0


def test_the_attention_simulation_catches_an_empty_count_of_one():
    """With `empty` counting 1 (a single consumer's release freeing the stage) the producer overwrites a stage the
    other consumer still reads."""
    S, n = 2, 6
    failures = 0
    for seed in range(6):
        empty, ready = [CountedBarrier(1) for _ in range(S)], [MBarrier() for _ in range(S)]
        ring = [{"data": None, "readers": set()} for _ in range(S)]
        gens = [attention_producer(n, S, empty, ready, ring, [])]
        gens += [attention_consumer(c, n, S, empty, ready, ring, [], False) for c in range(2)]
        try:
            _run(gens, random.Random(seed), "count-1 attention ring")
        except AssertionError as e:
            assert "overwrites" in str(e) or "reads stage" in str(e) or "deadlock" in str(e)
            failures += 1
    assert failures > 0
