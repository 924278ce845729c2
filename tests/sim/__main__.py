"""`python -m tests.sim [SEEDS]` (`just sim`): run seeds 0..SEEDS-1, report every failure by its
seed; `--seed N` replays one exactly and prints its schedule, what happened and its log.

String hashing is fixed (PYTHONHASHSEED=0, the process is started again with it when unset):
set iteration order then repeats across processes, so a seed replays as it ran.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time

HASHSEED = "0"


def _reexec_with_fixed_hashing() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASHSEED:
        os.environ["PYTHONHASHSEED"] = HASHSEED
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim", *sys.argv[1:]])


def _warm() -> None:
    """Import everything once and move it out of the collector's sight: a worker's runs then
    pay for their own garbage only."""
    import gc

    import tests.sim.run  # noqa: F401

    gc.freeze()


def _one(seed: int) -> tuple[int, bool, str, float, float]:
    from tests.sim.run import run_seed

    r = run_seed(seed)
    lines = "; ".join(f"{c.invariant}: {c.detail}" for c in r.failed())
    return seed, r.ok, lines, r.virtual, r.real


def _replay(seed: int, verbose: bool) -> int:
    from tests.chaos.invariants import report
    from tests.sim.run import format_record, run_seed

    if verbose:
        logging.getLogger().setLevel(logging.INFO)
    r = run_seed(seed)
    print(f"seed {seed}: {len(r.faults)} fault(s): " + ", ".join(f.describe() for f in r.faults))
    print("what happened (virtual time):")
    for n in r.notes:
        print(f"  {n.at:9.3f}s {n.text}")
    print(report(f"sim seed {seed} ({r.virtual:.0f} virtual s in {r.real:.2f} s)", r.checks))
    if not r.ok or verbose:
        print("log (warnings and worse):" if not verbose else "log:")
        for rec in r.logs[-300:]:
            print(format_record(rec))
    return 0 if r.ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="just sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("seeds", nargs="?", type=int, default=200, help="how many seeds to run (from --first)")
    p.add_argument("--first", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, default=None, help="replay this one seed and report it in full")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes running seeds")
    p.add_argument("--verbose", action="store_true", help="with --seed: every log line, INFO included")
    args = p.parse_args(argv)
    logging.getLogger().setLevel(logging.WARNING)  # each run captures what it logs
    if args.seed is not None:
        return _replay(args.seed, args.verbose)
    seeds = range(args.first, args.first + args.seeds)
    began = time.monotonic()
    failed = []
    virtual = 0.0
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(max(1, args.jobs), initializer=_warm) as pool:
        for seed, ok, why, v, _ in pool.imap_unordered(_one, seeds, chunksize=4):
            virtual += v
            if not ok:
                failed.append(seed)
                print(f"FAIL seed {seed}: {why}\n  replay: just sim --seed {seed}", flush=True)
    took = time.monotonic() - began
    per_minute = len(seeds) / took * 60 if took else 0.0
    print(
        f"sim: {len(seeds)} seeds ({args.first}..{args.first + len(seeds) - 1}), {len(failed)} failed, "
        f"{virtual / 3600:.1f} virtual hours in {took:.1f} s on {args.jobs} process(es): "
        f"{per_minute:.0f} schedules a minute"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    _reexec_with_fixed_hashing()
    sys.exit(main())
