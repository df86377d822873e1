"""Run one fuzz target (tests/fuzz/targets.py) under atheris, libFuzzer's engine for Python.

    python tests/fuzz/run.py TARGET [--seconds N] [--corpus DIR] [--runs N]
    python tests/fuzz/run.py --list

The corpus starts from the seeds (tests/fuzz/seeds.py: what the shipped configs, TKE's guide and
Multus's docs write), copied into ``--corpus`` (default: a temporary directory), where the fuzzer
keeps what it finds. A crash (any exception but the parser's typed errors, or one input running over 10 s)
ends the run with a non-zero exit and the input in ``crash-*`` files in the working directory.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

import atheris

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

with atheris.instrument_imports(include=["rdma_cni", "tests.fuzz"]):
    from tests.fuzz.targets import TARGETS

from tests.fuzz.seeds import SEEDS  # noqa: E402  (not instrumented: the inputs, not the code)


def seed_corpus(target: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for seed in SEEDS[target]:
        (directory / hashlib.sha1(seed).hexdigest()).write_bytes(seed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", choices=sorted(TARGETS))
    p.add_argument("--seconds", type=int, default=60, help="stop after this long (default 60)")
    p.add_argument("--runs", type=int, default=0, help="stop after this many inputs (default: no bound)")
    p.add_argument("--corpus", help="the corpus directory (default: a temporary one)")
    p.add_argument("--list", action="store_true", help="name the targets and stop")
    args = p.parse_args()
    if args.list or not args.target:
        for name, fn in sorted(TARGETS.items()):
            print(f"{name:16} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    corpus = Path(args.corpus or tempfile.mkdtemp(prefix=f"rdma-cni-fuzz-{args.target}-"))
    seed_corpus(args.target, corpus)
    for seed in SEEDS[args.target]:  # every seed is a valid run before the fuzzer starts
        TARGETS[args.target](seed)
    argv = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={args.seconds}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        f"-artifact_prefix={os.getcwd()}/",
    ]
    if args.runs:
        argv.append(f"-runs={args.runs}")
    atheris.Setup(argv, TARGETS[args.target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
