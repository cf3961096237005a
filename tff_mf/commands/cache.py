"""``tff-mf cache list|verify``: inspect and check the factorization cache
(``tff_mf.factorization.cache``)."""

from __future__ import annotations

import argparse
import os

from tff_mf import clitools


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "cache", help="list or verify cached factorizations",
      description="Lists or verifies the factorization cache (default ~/.cache/tff_mf, "
                  "or $TFF_MF_CACHE, or --cache_dir).")
  actions = parser.add_subparsers(dest="cache_action", metavar="ACTION")
  actions.required = True
  for name, help_text in (("list", "one line per cached factorization, each checked as a load "
                                   "checks it (sha256, B·C = A on secret random vectors, every "
                                   "figure recomputed from C): the figures shown are verified; "
                                   "an entry that fails is listed as BAD with the reason (exit 1)"),
                          ("verify", "check every entry (sha256, shapes, dtype, "
                                     "triangularity, B·C = A, the key and schema recomputed from "
                                     "the sidecar, every figure recomputed from C): every check a "
                                     "load applies; exit 1 naming each bad entry")):
    sub = actions.add_parser(name, help=help_text)
    clitools.add_cache_dir_flag(sub)
    sub.add_argument("--json", action="store_true", help="print JSON (default: off)")
    if name == "verify":
      sub.add_argument("--quick", action="store_true",
                       help="check B·C = A on secret random vectors (O(n²)) instead of the full "
                            "product (default: off)")
    sub.set_defaults(func=run)


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def run(args: argparse.Namespace) -> int:
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  root = cache.resolve_dir(args.cache_dir)
  if args.cache_action == "list":
    if args.cache_dir is not None and not os.path.isdir(root):
      raise cache.CacheError(f"cache directory {root} does not exist")
    rows = cache.list_entries(args.cache_dir)
    if args.json:
      print(jsonio.dumps({"cache_dir": root, "entries": rows,
                          "bad": sum(1 for r in rows if "error" in r)}))
      return 1 if any("error" in r for r in rows) else 0
    bad = sum(1 for r in rows if "error" in r)
    print(f"cache: {root} ({len(rows)} entries, {len(rows) - bad} verified"
          f"{f', {bad} BAD' if bad else ''}; figures recomputed from each entry's matrices)")
    if rows:
      header = (f"{'strategy':<24} {'workload':<16} {'n':>6} {'participation':<18} "
                f"{'sens':>9} {'rmse':>9} {'sqrt(L)':>10} {'MB':>8}  entry")
      print(header)
      for r in rows:
        if "error" in r:
          print(f"{'BAD':<24} {r['error']} (recompute it with tff-mf factorize ... --force)")
          continue
        strategy = r["strategy"] or "?"
        params = ",".join(f"{k[0]}={r[k]}" for k in ("bands", "rank", "buffers")
                          if r.get(k) not in (None, 0))
        if params:
          strategy += f"({params})"
        workload = r["workload"] or "?"
        if workload == "momentum":
          workload += f" {r['momentum']:g}"
          if r.get("lr_schedule") not in (None, "constant"):
            workload += f" {r['lr_schedule']}"
        size = None if r["bytes"] is None else r["bytes"] / 1e6
        print(f"{strategy:<24} {workload:<16} {_fmt(r['n'], 'd'):>6} "
              f"{r.get('participation') or '-':<18} {_fmt(r['sensitivity'], '.5g'):>9} "
              f"{_fmt(r['rmse'], '.4g'):>9} "
              f"{_fmt(r['single_participation_sqrt_loss'], '.4f'):>10} "
              f"{_fmt(size, '.1f'):>8}  {r['directory']}")
    return 1 if any("error" in r for r in rows) else 0
  results = cache.verify(args.cache_dir, full_check=not args.quick)
  bad = [r for r in results if not r["ok"]]
  if args.json:
    print(jsonio.dumps({"cache_dir": root, "entries": results, "bad": len(bad)}))
  else:
    for r in results:
      print(("ok   " if r["ok"] else "BAD  ") + (r["path"] if r["ok"] else r["error"]))
    print(f"{len(results) - len(bad)} of {len(results)} entries ok in {root}")
  return 1 if bad else 0
