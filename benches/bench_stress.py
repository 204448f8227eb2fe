"""The adversarial fragmentation search (npumem.stress) against every allocator family.

For each family and objective (capacity: min capacity / bound; reserved: peak reserved on a roomy
device / bound; the bound is the peak live bytes rounded up to 2 MiB), a seeded search of a fixed
number of evaluations (the same result on any machine), shrunk; the table gives the worst score
found and how every family does on that workload. Each worst workload is saved under
target/stress/ as a trace; a case where npumem needs more capacity than another family is flagged
(copy it to tests/stress_cases/ to make it a regression test).

Run: make bench B=stress   (or: .venv/bin/python benches/bench_stress.py [--evaluations N] [--seed S])
"""

from __future__ import annotations

import argparse
import os

from npumem import stress
from npumem.units import fmt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evaluations", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join("target", "stress"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fams = stress.FAMILIES
    print(f"| attacked | objective | worst | blocks | bound | {' | '.join(f'{f} cap / res' for f in fams)} |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(fams))
    for objective in ("capacity", "reserved"):
        for fam in fams:
            r = stress.search(fam, evaluations=args.evaluations, seed=args.seed, objective=objective)
            path = os.path.join(args.out, f"{fam}-{objective}-{args.seed}.json")
            r.save(path)
            rep = r.report()
            cells = " | ".join(
                f"{r.families[f]['capacity_ratio']:.3f} / {r.families[f]['reserved_ratio']:.3f}" for f in fams
            )
            print(f"| {fam} | {objective} | {r.score:.3f} | {rep['allocs']} | {fmt(rep['bound'])} | {cells} |")
            mine = r.families["npumem"]["min_capacity"]
            better = [f for f in fams if f != "npumem" and r.families[f]["min_capacity"] < mine]
            if better:
                print(f"<!-- npumem needs {fmt(int(mine))}, less for {', '.join(better)}: {path} -->")


if __name__ == "__main__":
    main()
