#!/usr/bin/env python3
"""The GPU path's speed targets, checked against what deploy/gpu_check.sh measured.

  gpu_targets.py step STEP.json            cuda_step_bench --json rows (check 5)
  gpu_targets.py pipeline ONE.csv TWO.json one process's metrics.csv against two GPU workers'
                                           summary.json (check 7)

Prints one line per target with the figure beside it; exits 1 if any is missed, 2 if a file
cannot be read.
"""
import csv
import json
import sys

# bf16 cases of cuda_step_bench and what each must reach: MFU at least, PyTorch's peak memory at
# most (eager's, and torch.compile's where it ran), and for the whole model torch.compile's tokens/s.
STEP_TARGETS = {
    "stage8": {"mfu": 0.45, "against_compile": False},
    "xl2": {"mfu": 0.50, "against_compile": True},
    "xl4": {"mfu": 0.50, "against_compile": True},
}
# Two GPU workers of configs/gpu-pipeline.toml against the same model in one process.
PIPELINE_RATIO = 1.25


def check(lines, ok, text):
    lines.append(("PASS " if ok else "FAIL ") + text)
    return ok


def step(path):
    rows = json.load(open(path))
    by_case = {r["case"]: r for r in rows if r.get("precision") == "bf16"}
    lines, ok = [], True
    for case, target in STEP_TARGETS.items():
        r = by_case.get(case)
        if r is None:
            ok &= check(lines, False, f"{case}: no bf16 row in {path} (run it with --cases {case})")
            continue
        if "error" in r:
            ok &= check(lines, False, f"{case}: {r['error']}")
            continue
        ok &= check(lines, r["mfu"] >= target["mfu"],
                    f"{case}: MFU {100 * r['mfu']:.1f}% (target >= {100 * target['mfu']:.0f}%)")
        for side in ("eager", "compile"):
            t = r.get(side)
            if t is None:
                if side == "eager":
                    ok &= check(lines, False, f"{case}: PyTorch eager not run, so memory is not compared")
                continue
            if "tokens_per_s" not in t:
                ok &= check(lines, False, f"{case}: PyTorch {side} did not run: {t.get('why', '?')}")
                continue
            if side == "compile" and target["against_compile"]:
                ok &= check(lines, r["tokens_per_s"] >= t["tokens_per_s"],
                            f"{case}: {r['tokens_per_s']:.0f} tokens/s, {r['tokens_per_s'] / t['tokens_per_s']:.2f}x "
                            f"torch.compile's {t['tokens_per_s']:.0f} (target >= 1.0x)")
            ok &= check(lines, r["gib"] <= t["gib"],
                        f"{case}: peak memory {r['gib']:.1f} GiB, PyTorch {side} {t['gib']:.1f} GiB (target <=)")
    if not any(r.get("compile") for r in by_case.values() if r["case"] in STEP_TARGETS):
        ok &= check(lines, False, "torch.compile ran on no case with a target (cuda_step_bench --compile xl2)")
    return ok, lines


def pipeline(one_csv, two_json):
    rows = list(csv.DictReader(open(one_csv)))[1:]
    if not rows:
        return False, [f"FAIL {one_csv}: no iteration after the first"]
    one = sorted(float(r["seconds"]) for r in rows)[len(rows) // 2]
    s = json.load(open(two_json))
    two = s["iteration_seconds"]
    waits = ", ".join("stage %d waits %.0f%% of %.3f s" % (w["stage"], 100 * w["wait_seconds"] / w["seconds"],
                                                            w["seconds"]) for w in s["workers"])
    lines = []
    ok = check(lines, two <= PIPELINE_RATIO * one,
               f"one process {one:.3f} s per iteration, two GPU workers over loopback {two:.3f} s "
               f"({two / one:.2f}x; target <= {PIPELINE_RATIO}x); {waits}")
    return ok, lines


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "step":
            ok, lines = step(argv[2])
        elif len(argv) == 4 and argv[1] == "pipeline":
            ok, lines = pipeline(argv[2], argv[3])
        else:
            print(__doc__.strip(), file=sys.stderr)
            return 2
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"gpu_targets: cannot read the measurements in {' '.join(argv[2:])}: {e!r}; run the GPU check "
              "that writes them again", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
