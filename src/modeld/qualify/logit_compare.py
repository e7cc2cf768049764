"""Compare teacher-forced logits of an engine against a reference (HF on the same weights).

Every function takes logits stacked over the teacher-forced positions, `[N, V]` (N positions of
one or more prompts, V the vocabulary), as torch tensors of any float dtype on any device; the
maths runs in float32 on that device and the results are plain Python numbers (JSON-ready).

* `compare_logits` — the greedy-parity view: exact argmax agreement, near-tie disagreements
  (KNOWLEDGE/pitfalls/greedy-parity-breaks-at-bf16-logit-ties.md: a disagreement is a near-tie
  when the reference's own logit of the engine's pick is within `tie` + that position's top-k
  logit error of the reference's top), max |Δ| over the reference top-k, max / mean |Δ| over the
  whole vocabulary.
* `compare_fixture` — the same rule against a committed greedy fixture that stores only each
  step's top-k ids and logits (modeld-greedy-fixture, bench/hf_control_27b.py).
* `quality` — quality of an engine profile against a bf16 reference: top-1 agreement and
  KL(reference ‖ engine) per position (mean and max), in nats.

Pure functions: nothing is mutated. Raise `LogitShapeError` for mismatched inputs.
"""

from __future__ import annotations

from modeld.errors import ModeldError


class LogitShapeError(ModeldError):
    """Engine and reference logits do not cover the same positions x vocabulary."""


def _pair(eng, ref):
    if eng.dim() != 2 or tuple(eng.shape) != tuple(ref.shape):
        raise LogitShapeError(f"logits must both be [N, V]; got {list(eng.shape)} and {list(ref.shape)}")
    return eng.float(), ref.to(eng.device).float()


def compare_logits(eng, ref, top_k: int = 10, tie: float = 0.125) -> dict:
    """Engine logits [N, V] against reference logits [N, V] at the same positions.

    Returns positions, exact argmax agreements, near-tie disagreements, other disagreements,
    `pass` (True when every disagreement is a near-tie), max |Δ| over the reference's top-k,
    max and mean |Δ| over the full vocabulary, and `disagreements`: for each position whose argmax
    differs, the ids, the reference's margin (its top minus its logit of the engine's pick), the margin
    the rule allows (tie + that position's top-k error) and the engine's lead (its pick minus its
    logit of the reference's top) — so a failed gate shows how far past the rule each flip was.
    Raises LogitShapeError.
    """
    import torch

    e, r = _pair(eng, ref)
    vals, ids = torch.topk(r, min(top_k, r.shape[1]), dim=1)            # [N, k]
    topk_err = (e.gather(1, ids) - vals).abs().amax(dim=1)               # [N]
    diff = (e - r).abs()                                                  # [N, V]
    pick = e.argmax(dim=1)                                                # [N]
    top = r.argmax(dim=1)
    exact = pick == top
    margin = vals[:, 0] - r.gather(1, pick[:, None])[:, 0]               # ref top - ref(engine pick)
    near = ~exact & (margin <= tie + topk_err)
    other = ~exact & ~near
    lead = e.gather(1, pick[:, None])[:, 0] - e.gather(1, top[:, None])[:, 0]
    flips = [{"position": i, "ref_top": int(top[i]), "engine_pick": int(pick[i]), "margin": float(margin[i]),
              "allowed": float(tie + topk_err[i]), "engine_lead": float(lead[i]), "near_tie": bool(near[i])}
             for i in (~exact).nonzero()[:, 0].tolist()]
    return {
        "positions": int(e.shape[0]), "argmax_agree": int(exact.sum()),
        "near_tie_disagreements": int(near.sum()), "other_disagreements": int(other.sum()),
        "pass": bool(other.sum() == 0), "tie_margin": tie, "top_k": int(ids.shape[1]),
        "max_abs_topk": float(topk_err.max()), "max_abs_full": float(diff.max()),
        "mean_abs_full": float(diff.mean()), "disagreements": flips,
    }


def compare_fixture(eng, steps: list[dict], tokens: list[int], tie: float = 0.125) -> dict:
    """Engine logits [N, V] against a fixture's steps (each {"topk_ids", "topk_logits"}) and
    greedy tokens (N of each). Same near-tie rule as `compare_logits`, with the fixture's stored
    top-k as the reference. Raises LogitShapeError when the counts differ."""
    import torch

    if eng.dim() != 2 or eng.shape[0] != len(steps) or len(steps) != len(tokens):
        raise LogitShapeError(f"{list(eng.shape)} logits for {len(steps)} fixture steps / {len(tokens)} tokens")
    e = eng.float()
    agree = near = other = 0
    worst = 0.0
    for j, (step, tok) in enumerate(zip(steps, tokens)):
        ids = torch.tensor(step["topk_ids"], device=e.device)
        ref = torch.tensor(step["topk_logits"], device=e.device, dtype=torch.float32)
        err = float((e[j, ids] - ref).abs().max())
        worst = max(worst, err)
        pick = int(e[j].argmax())
        if pick == tok:
            agree += 1
        elif pick in step["topk_ids"] and step["topk_logits"][0] - step["topk_logits"][step["topk_ids"].index(pick)] <= tie + err:
            near += 1
        else:
            other += 1
    return {"positions": len(steps), "argmax_agree": agree, "near_tie_disagreements": near,
            "other_disagreements": other, "pass": other == 0, "tie_margin": tie,
            "max_abs_topk": worst}


def quality(ref, eng) -> dict:
    """Top-1 agreement and KL(softmax(ref) ‖ softmax(eng)) per position, in nats (float32).

    `ref` is the bf16 reference (HF on the unquantized weights), `eng` the profile under test.
    Raises LogitShapeError."""
    import torch

    e, r = _pair(eng, ref)
    logp_r = torch.log_softmax(r, dim=1)
    logp_e = torch.log_softmax(e, dim=1)
    kl = (logp_r.exp() * (logp_r - logp_e)).sum(dim=1)                  # [N]
    agree = (e.argmax(dim=1) == r.argmax(dim=1))
    return {"positions": int(e.shape[0]), "top1_agree": int(agree.sum()),
            "top1_agreement": float(agree.float().mean()), "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()), "max_abs_full": float((e - r).abs().max()),
            "mean_abs_full": float((e - r).abs().mean())}


def merge(rows: list[dict]) -> dict:
    """Combine per-prompt `compare_*` results: counts add, maxima take the max, means are
    weighted by positions; per-prompt rows are kept under "cases"."""
    out: dict = {"cases": rows}
    n = sum(r["positions"] for r in rows)
    for key in rows[0]:
        vals = [r[key] for r in rows]
        if key in ("pass",):
            out[key] = all(vals)
        elif key.startswith("max_") or key.endswith("_max"):
            out[key] = max(vals)
        elif key.startswith("mean_") or key in ("top1_agreement", "kl_mean"):
            out[key] = sum(v * r["positions"] for v, r in zip(vals, rows)) / max(n, 1)
        elif key in ("tie_margin", "top_k"):
            out[key] = vals[0]
        elif isinstance(vals[0], (int, float)) and not isinstance(vals[0], bool):
            out[key] = sum(vals)
    return out


def fixture_topk_diff(mine: list[dict], theirs: list[dict]) -> float | None:
    """Max |logit| difference between two greedy runs' stored steps, over the steps whose top-k
    ids agree (same order); None when no step does."""
    diffs = [abs(x - y) for s, t in zip(mine, theirs) if s["topk_ids"] == t["topk_ids"]
             for x, y in zip(s["topk_logits"], t["topk_logits"])]
    return max(diffs) if diffs else None
