"""The mbarrier protocol of linear/gemm_ws_gluon.py, simulated on the CPU (Gluon kernels do not run in the
interpreter): its producer and consumer, restated step for step as Python generators over model mbarriers with
PTX's phase-parity semantics, interleaved in random orders. Checks: no deadlock; the consumer reads every stage only
after the producer's copy for that very (tile, K step) landed; the producer never overwrites a stage whose wgmma
may still read it; every program walks the tiles pid, pid + NPROG, ... . A change to the kernel's ring positions,
parities or releases must be mirrored here (the restatement is the spec of the handshake)."""

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


def consumer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log):
    it = 0
    in_flight = []  # stages whose wgmma may still read shared memory
    for t in range(pid, tiles, nprog):
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
        for done in in_flight:  # warpgroup_mma_wait(0)
            ring[done]["reading"] = None
        in_flight = []
        empty[(it - 1) % S].complete()  # the tile's last stage back to the producer
        log.append(("tile", t))
        yield "epilogue"


@pytest.mark.parametrize("S", [2, 3, 4])
@pytest.mark.parametrize("tiles,nprog", [(1, 1), (5, 5), (7, 3), (9, 2)])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 7])
@pytest.mark.parametrize("seed", [0, 1])
def test_ring_protocol(S, tiles, nprog, k_tiles, seed):
    rng = random.Random(seed * 1000 + S * 100 + tiles * 10 + k_tiles)
    for pid in range(nprog):
        empty, ready = [MBarrier() for _ in range(S)], [MBarrier() for _ in range(S)]
        ring = [{"data": None, "reading": None} for _ in range(S)]
        log: list = []
        gens = [producer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log),
                consumer(pid, nprog, tiles, k_tiles, S, empty, ready, ring, log)]
        live, stalls = list(gens), 0
        while live:
            g = rng.choice(live)
            try:
                step = next(g)
            except StopIteration:
                live.remove(g)
                continue
            stalls = stalls + 1 if step.startswith("wait") else 0
            assert stalls < 10_000, f"deadlock: both sides waiting (S {S}, tiles {tiles}, k {k_tiles})"
        mine = list(range(pid, tiles, nprog))
        assert [e[1] for e in log if e[0] == "tile"] == mine
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
