"""A toy timeline of one SM's two TLX backward consumers, DQ_LAG free-running against the consumer turns of
``configs.BACKWARD_ALTERNATE`` (bench/NOTES.md "TLX backward: consumer alternation"; CPU, ~5 s).

Per query block each consumer issues three wgmma groups and runs three ALU segments: I1 (S, dP) | A1 (after S) | I2
(dV) | A2 (after dP) | I3 (dQ halves, dK) | A3 (after dQ; then it waits for dK). The tensor unit executes k-step
instructions one at a time in issue order; a group's instructions are issued over ``issue`` clk, so groups issued by
both consumers at about the same time interleave. An ALU segment progresses at rate 1, or 1/2 while the other
consumer is also in one (issue slots and the MUFU pipe of an SMSP are shared). A turn (a group in ``turns``) waits
for the token and costs ``turn_clk``. Left out: the producer, DQ_LAG's dS signalling, shared-memory port and L2
limits (scale the wgmma times for the port), per-item work. ``python tools/bwd_turns_model.py`` prints clk per block
pair and the tensor unit's busy share for the cases the NOTES section quotes.
"""
from __future__ import annotations

SEQUENCE = ("I1", "A1", "I2", "A2", "I3", "A3")
# what each ALU segment waits for: (issue, group index): S, dP, dQ's second half
WAITS = {"A1": ("I1", 0), "A2": ("I1", 1), "A3": ("I3", 1)}


def groups(gemm_clk: float):
    """Each issue's groups as (k-steps, clk per step), ``gemm_clk`` a 64x64xD product's time: S and dP (8 steps of
    16 at D128), dV and dK (64xD over 64 rows: 4 steps), the two dQ halves (64x(D/2) over 64 keys each)."""
    return {"I1": [(8, gemm_clk / 8)] * 2, "I2": [(4, gemm_clk / 4)],
            "I3": [(4, gemm_clk / 8), (4, gemm_clk / 8), (4, gemm_clk / 4)]}


def run(turns=(), gemm_clk=256.0, alu=(450, 300, 250), blocks=40, issue=40, turn_clk=30, step=2.0):
    """(clk per block pair, tensor busy share) after ``blocks`` blocks of both consumers."""
    by_issue = groups(gemm_clk)
    queue, done = [], set()  # tensor queue entries [clk left, tag or None]; tags of finished groups
    state = [dict(pc=0, blk=0, left=None, at=None) for _ in range(2)]
    issuing = [[], []]  # per consumer: (time, queue entry) still to be issued
    token, t, busy = 0, 0.0, 0.0
    while min(s["blk"] for s in state) < blocks:
        if queue:
            queue[0][0] -= step
            busy += step
            if queue[0][0] <= 0:
                done.add(queue.pop(0)[1])
        for c in range(2):
            while issuing[c] and issuing[c][0][0] <= t:
                queue.append(issuing[c].pop(0)[1])
        both_alu = all(SEQUENCE[s["pc"]].startswith("A") and s["left"] is not None for s in state)
        for c, s in enumerate(state):
            if s["blk"] >= blocks:
                continue
            op = SEQUENCE[s["pc"]]
            if op.startswith("I"):
                turn = op in turns
                if issuing[c] or (turn and token != c):
                    continue
                if s["at"] is None:
                    s["at"] = t + (turn_clk if turn else 0)
                if t < s["at"]:
                    continue
                steps = [(g, clk) for g, (n, clk) in enumerate(by_issue[op]) for _ in range(n)]
                for i, (g, clk) in enumerate(steps):
                    last = i + 1 == len(steps) or steps[i + 1][0] != g
                    issuing[c].append((t + issue * i / len(steps), [clk, (c, s["blk"], op, g) if last else None]))
                s["at"] = None
                s["pc"] += 1
                if turn:
                    token = 1 - c
                continue
            if s["left"] is None:
                if (c, s["blk"]) + WAITS[op] not in done:
                    continue
                s["left"] = alu[int(op[1]) - 1]
            s["left"] -= step * (0.5 if both_alu else 1.0)
            if s["left"] > 0:
                continue
            if op == "A3" and (c, s["blk"], "I3", 2) not in done:  # dK before the next block
                s["left"] = 1e-3
                continue
            s["left"] = None
            s["pc"] = (s["pc"] + 1) % len(SEQUENCE)
            s["blk"] += op == "A3"
        t += step
    return t / blocks, busy / t


def main() -> None:
    cases = [("D128, wgmma at peak", 256, (450, 300, 250)), ("D128, wgmma x1.33", 340, (450, 300, 250)),
             ("D64", 128, (420, 300, 230)), ("D64, wgmma x1.33", 170, (420, 300, 230))]
    for label, gemm_clk, alu in cases:
        for issue in (40, 300):
            free = run((), gemm_clk, alu, issue=issue)
            row = [f"{label:20s} issue {issue:3d}: free {free[0]:5.0f} ({free[1]:.2f})"]
            for turns in (("I1", "I2", "I3"), ("I1",)):
                clk, share = run(turns, gemm_clk, alu, issue=issue)
                row.append(f"{len(turns)} turn(s) {clk:5.0f} ({share:.2f}) x{free[0] / clk:.3f}")
            print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
