"""Operating characteristics of ``--until-decided`` (``ragbench.analysis.sequential``): 2,000
simulated comparisons of two variants on 400 paired 0/1 questions in 5 rounds, x the cheaper,
for each spending function, with no true difference and with a true 10-point difference either
way; beside each, the fixed design (all 400 questions, one test at the same level) on the same
simulated answers. Writes ``benchmarks/results/sequential.json``.

    python benchmarks/sequential.py [--runs 2000] [--questions 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragbench.analysis.sequential import SPENDING, simulate

# (name, P(only x right), P(only y right)): 30% of questions discordant, as two RAG/long-context
# variants of similar accuracy disagree on
SCENARIOS = (
    ("no difference", 0.15, 0.15),
    ("x 10 points better", 0.20, 0.10),
    ("y 10 points better", 0.10, 0.20),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--questions", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sequential.json"))
    args = ap.parse_args()
    results = []
    for spending in SPENDING:
        for name, x_only, y_only in SCENARIOS:
            r = simulate(
                args.questions,
                args.rounds,
                x_only,
                y_only,
                spending=spending,
                runs=args.runs,
                seed=0,
            )
            r["scenario"] = name
            s, f = r["sequential"], r["fixed"]
            print(
                f"{spending:15s} {name:20s} sequential: x better {s['x_better']:.3f}, y better "
                f"{s['y_better']:.3f}, decided {s['decided']:.3f}, mean questions "
                f"{s['mean_questions']:.0f} | fixed: x better {f['x_better']:.3f}, y better "
                f"{f['y_better']:.3f}, decided {f['decided']:.3f}, {f['mean_questions']:.0f}"
            )
            results.append(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "sequential", "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
