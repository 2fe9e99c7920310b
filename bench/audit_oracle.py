"""The API model's fidelity to Python: for each installed package, eyas's modelled signatures of every
public function, class constructor and method against `inspect.signature` of the live objects
(`eyas.audit.oracle`). One JSON line per package: matched / mismatched / unknown / no_signature,
matched_share (the baseline is Python itself), error_capable (mismatches that could give a wrong
error: must be 0) and the seconds taken (import and comparison). `--list` adds one line per
error-capable mismatch.

    .venv/bin/python bench/audit_oracle.py                       # the packages the issue names
    .venv/bin/python bench/audit_oracle.py transformers --list
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from eyas.audit.oracle import package_fidelity

PACKAGES = ["pydantic", "safetensors", "accelerate", "peft", "torch", "transformers", "vllm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=PACKAGES)
    parser.add_argument("--depth", type=int, default=1, help="public submodule levels below each package")
    parser.add_argument("--list", action="store_true", help="one line per error-capable mismatch")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for package in args.packages:
        started = time.perf_counter()
        try:
            fidelity = package_fidelity(package, args.depth)
        except ImportError as error:
            print(f"{package}: not importable here ({error})", file=sys.stderr)
            continue
        line = {"bench": "audit_oracle", **fidelity.summary(), "depth": args.depth,
                "seconds": round(time.perf_counter() - started, 1), "python": sys.version.split()[0]}
        print(json.dumps(line), flush=True)
        if args.list:
            for comparison in fidelity.error_capable:
                print(json.dumps({"bench": "audit_oracle", "package": package, "error_capable": comparison.qualname,
                                  "modelled": comparison.modelled, "live": comparison.live}), flush=True)


if __name__ == "__main__":
    main()
