"""Fits the ring cost model to a cluster all-reduce sweep (run_cluster.py
allreduce), says how well it fits, and extrapolates step time and scaling
efficiency to larger jobs with faster links.

    .venv/bin/python benchmarks/fit_scaling.py                 # newest sweep
    .venv/bin/python benchmarks/fit_scaling.py \\
        benchmarks/results/cluster-allreduce-DATE.json --out fit.json

Models (S: bytes all-reduced per rank; n ranks, H hosts, L = n / H ranks per
host; alpha: seconds per ring step, beta: seconds per byte over one host's
link):

- flat ring (ronde with RONDE_HIERARCHICAL=0, torch.distributed's gloo):
  T(S) = 2(n-1) alpha + 2(n-1)/n S beta. The ranks of a host are next to
  each other in the ring, so each host link carries one ring edge per
  direction: 2(n-1)/n S bytes.
- hierarchical (ronde, RONDE_HIERARCHICAL=1): a shared-memory
  reduce-scatter within each host, then L all-reduces across the H hosts at
  once (local rank l of every host, S/L bytes each), then a shared-memory
  all-gather. The L cross rings share their host's link, which carries
  L x 2(H-1)/H x S/L = 2(H-1)/H S bytes per direction:
  T(S) = 2(H-1) alpha + 2(H-1)/H S beta [+ the local stages].
  Fitted as it stands, the local stages are folded into alpha and beta
  (both then slightly above the link's). Predicted from the flat fit
  instead (same Gloo transport, so its alpha and beta), with the local
  stages as their own term 2(L-1)/L S / shm_busbw (a local all-reduce's
  traffic at ronde's shared-memory busbw, --shm-busbw-gbs; 0: free): that
  prediction's error is what the local stages and the model miss.

Fit: least squares on the relative error (each size weighs the same, from
4 KiB to 256 MiB), alpha and beta kept non-negative.

Extrapolation: alpha as fitted (the median over the sweep's link rates),
beta = 1 / link rate (10, 25, 100 Gbit/s), the gradients of two models all
reduced once per step as one buffer (mlp: counted from train_bench.cpp's
make_mlp; ResNet-50: 25.6M float32 parameters, 102.2 MB), n from 8 to 512
ranks, hierarchical with --per-host ranks per host. The step: compute time
C (--compute-ms) plus the all-reduce time T with no overlap (C + T), or
max(C, T) with full overlap of communication and backward: two bounds.
Scaling efficiency = C / step (1: communication costs nothing).
"""
import argparse
import glob
import json
import os
import re
import sys

import numpy as np

from run_allreduce import comma_list, size_label  # same directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")

# ResNet-50 (torchvision): 25,557,032 parameters, float32.
RESNET50_PARAMS = 25_557_032
# Per-step compute defaults (ms), see --compute-ms.
COMPUTE_MS = {"mlp": 380.0, "resnet50": 100.0}
# ronde's shared-memory all-reduce busbw on this machine at 64-256 MiB, 2
# ranks: 2.7 to 4.4 GB/s (results/allreduce-shm-2026-12-01.json).
SHM_BUSBW_GBS = 4.0


def rel(path):
    path = os.path.abspath(path)
    return (os.path.relpath(path, ROOT)
            if os.path.commonpath([path, ROOT]) == ROOT else path)


def mlp_params(path=os.path.join(HERE, "train_bench.cpp")):
    """The parameters of train_bench.cpp's make_mlp: its Linear layers, each
    in x out weights and out biases (LibTorch's default, bias on)."""
    with open(path) as f:
        src = f.read()
    m = re.search(r"make_mlp\(\)\s*\{(.*?)\n\}", src, re.S)
    if not m:
        raise SystemExit(f"{path}: no make_mlp() found")
    layers = [(int(i), int(o)) for i, o in re.findall(
        r"Linear\(\s*(\d+)\s*,\s*(\d+)\s*\)", m.group(1))]
    if not layers:
        raise SystemExit(f"{path}: make_mlp() has no Linear(in, out)")
    return sum(i * o + o for i, o in layers), layers


def fit(x_alpha, x_beta, t):
    """min sum ((x_alpha a + x_beta(S) b - t) / t)^2 over a, b >= 0."""
    A = np.column_stack([np.full_like(t, x_alpha), x_beta]) / t[:, None]
    y = np.ones_like(t)
    best = None
    for cols in ((0, 1), (0,), (1,)):
        coef, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(2)
        full[list(cols)] = coef
        err = float(((A @ full - y) ** 2).sum())
        if best is None or err < best[1]:
            best = (full, err)
        if len(cols) == 2:
            break  # the unconstrained optimum is feasible: it is the best
    return best[0]


def flat_terms(n, sizes):
    return 2 * (n - 1), 2 * (n - 1) / n * sizes


def hier_terms(hosts, sizes):
    return 2 * (hosts - 1), 2 * (hosts - 1) / hosts * sizes


def local_term(per_host, sizes, shm_gbs):
    if not shm_gbs or per_host <= 1:
        return np.zeros_like(sizes)
    return 2 * (per_host - 1) / per_host * sizes / (shm_gbs * 1e9)


def pct(pred, meas):
    return 100.0 * (pred - meas) / meas


def fit_group(g, shm_gbs, impls):
    n, hosts, per_host = g["ranks"], g["hosts"], g["per_host"]
    rows = g["summary"]
    sizes = np.array([r["bytes"] for r in rows], dtype=float)
    link_bps = g["rate_bits"] / 8.0
    out = {"rate": g["rate"], "link_gbit": g["rate_bits"] / 1e9,
           "ranks": n, "hosts": hosts, "per_host": per_host, "fits": {},
           "sizes": []}
    pred = {}
    for impl in impls:
        t = np.array([r[f"{impl}_time_us"] for r in rows]) * 1e-6
        xa, xb = (hier_terms(hosts, sizes) if impl == "hier"
                  else flat_terms(n, sizes))
        alpha, beta = fit(xa, xb, t)
        p = xa * alpha + xb * beta
        pred[impl] = p
        err = pct(p, t)
        out["fits"][impl] = {
            "model": ("2(H-1) alpha + 2(H-1)/H S beta" if impl == "hier"
                      else "2(n-1) alpha + 2(n-1)/n S beta"),
            "alpha_us": alpha * 1e6, "beta_s_per_byte": beta,
            "bandwidth_gbit": 8 / beta / 1e9 if beta else None,
            "of_link": 1 / beta / link_bps if beta else None,
            "rms_err_pct": float(np.sqrt((err ** 2).mean())),
            "max_abs_err_pct": float(np.abs(err).max())}
    if "hier" in impls and "flat" in impls:
        f = out["fits"]["flat"]
        xa, xb = hier_terms(hosts, sizes)
        p = (xa * f["alpha_us"] * 1e-6 + xb * f["beta_s_per_byte"] +
             local_term(per_host, sizes, shm_gbs))
        pred["hier_from_flat"] = p
        t = np.array([r["hier_time_us"] for r in rows]) * 1e-6
        err = pct(p, t)
        out["fits"]["hier_from_flat"] = {
            "model": "2(H-1) alpha_flat + 2(H-1)/H S beta_flat + "
                     "2(L-1)/L S / shm_busbw",
            "shm_busbw_GBs": shm_gbs or None,
            "rms_err_pct": float(np.sqrt((err ** 2).mean())),
            "max_abs_err_pct": float(np.abs(err).max())}
    for i, r in enumerate(rows):
        row = {"bytes": r["bytes"]}
        for impl, p in pred.items():
            meas = r[("hier" if impl == "hier_from_flat" else impl) +
                     "_time_us"]
            if impl != "hier_from_flat":
                row[f"{impl}_measured_us"] = meas
            row[f"{impl}_predicted_us"] = float(p[i] * 1e6)
            row[f"{impl}_err_pct"] = float(pct(p[i] * 1e6, meas))
        out["sizes"].append(row)
    return out


def median(xs):
    return float(np.median(xs))


def extrapolate(fits, sets, compute_ms, ranks, links, per_host, shm_gbs,
                impls, alpha_us=None):
    """Step time and efficiency per gradient set, link rate and rank count.
    Returns (alphas used, rows)."""
    alpha = {impl: median([f["fits"][impl]["alpha_us"] for f in fits]) * 1e-6
             for impl in impls}
    for impl, us in (alpha_us or {}).items():
        alpha[impl] = us * 1e-6
    # What the hierarchical fit's fixed cost holds beyond its cross rings'
    # latency (the local stages' per-call cost), held constant.
    local_fixed = 0.0
    if "hier" in impls and "flat" in impls:
        local_fixed = median([
            max(0.0, 2 * (f["hosts"] - 1) * (f["fits"]["hier"]["alpha_us"] -
                                            f["fits"]["flat"]["alpha_us"]))
            for f in fits]) * 1e-6
    rows = []
    for name, nbytes in sets.items():
        c = compute_ms[name] * 1e-3
        for gbit in links:
            beta = 8 / (gbit * 1e9)
            for n in ranks:
                if n % per_host or n // per_host < 2:
                    continue  # not n / per_host >= 2 whole hosts
                row = {"set": name, "bytes": nbytes, "link_gbit": gbit,
                       "ranks": n, "compute_ms": compute_ms[name]}
                for impl in impls:
                    if impl == "hier":
                        h = n // per_host
                        local = float(local_term(
                            per_host, np.array(float(nbytes)), shm_gbs))
                        row["hier_local_ms"] = (local + local_fixed) * 1e3
                        t = (2 * (h - 1) * alpha["flat"] +
                             2 * (h - 1) / h * nbytes * beta + local +
                             local_fixed)
                    else:
                        t = 2 * (n - 1) * alpha[impl] + \
                            2 * (n - 1) / n * nbytes * beta
                    row[f"{impl}_ms"] = t * 1e3
                    row[f"{impl}_eff_none"] = c / (c + t)
                    row[f"{impl}_eff_full"] = c / max(c, t)
                rows.append(row)
    return {"alpha_us": {k: v * 1e6 for k, v in alpha.items()},
            "hier_local_fixed_us": local_fixed * 1e6}, rows


def fmt(x, spec, width):
    return f"{'-':>{width}}" if x is None else f"{x:{spec}}"


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", nargs="?",
                   help="run_cluster.py allreduce's JSON (default: the "
                        "newest benchmarks/results/cluster-allreduce-*.json)")
    p.add_argument("--out", help="also write the fit and the extrapolation "
                                 "as JSON")
    p.add_argument("--compute-ms",
                   default=",".join(f"{k}={v:g}" for k, v in COMPUTE_MS.items()),
                   help="compute time per step, ms, per gradient set. "
                        "mlp=380: train_bench's local mlp step on this "
                        "machine (one thread, batch 64; results/"
                        "train-shm-2026-12-01.json); resnet50=100: about "
                        "batch 32 per accelerator at ~320 images/s, a "
                        "V100-class GPU in float32")
    p.add_argument("--ranks", default="8,16,32,64,128,256,512")
    p.add_argument("--links", default="10,25,100", help="Gbit/s")
    p.add_argument("--per-host", type=int, default=4,
                   help="ranks per host in the extrapolation (rank counts "
                        "that are not at least 2 whole hosts are left out; "
                        "the flat ring's time does not depend on it, the "
                        "hierarchical one's does)")
    p.add_argument("--shm-busbw-gbs", type=float, default=SHM_BUSBW_GBS,
                   help="the local stages' shared-memory busbw, GB/s (0: "
                        "free); default: ronde's 2-rank shared-memory "
                        "busbw at 64-256 MiB on this machine")
    p.add_argument("--alpha-us", default="",
                   help="use these alphas in the extrapolation instead of "
                        "the fitted ones, e.g. flat=50,torch=50 (us per "
                        "ring step; hier's cross rings use flat's)")
    a = p.parse_args()
    path = a.sweep
    if not path:
        found = sorted(glob.glob(os.path.join(HERE, "results",
                                              "cluster-allreduce-*.json")),
                       key=os.path.getmtime)
        if not found:
            p.error("no benchmarks/results/cluster-allreduce-*.json: run "
                    "benchmarks/run_cluster.py allreduce, or name a file")
        path = found[-1]
    with open(path) as f:
        sweep = json.load(f)
    if sweep.get("benchmark") != "cluster-allreduce":
        p.error(f"{path} is not a run_cluster.py allreduce result")
    compute = dict(COMPUTE_MS)
    for item in comma_list(a.compute_ms):
        k, _, v = item.partition("=")
        if k not in compute or not v:
            p.error(f"--compute-ms: {item} (mlp=MS,resnet50=MS)")
        compute[k] = float(v)
    alpha_us = {}
    for item in comma_list(a.alpha_us):
        k, _, v = item.partition("=")
        if k not in ("flat", "torch", "hier") or not v:
            p.error(f"--alpha-us: {item} (flat=US,torch=US)")
        alpha_us[k] = float(v)
    ranks = [int(x) for x in comma_list(a.ranks)]
    links = [float(x) for x in comma_list(a.links)]
    impls = [i for i in ("flat", "torch", "hier") if i in sweep["impls"]]
    mlp, layers = mlp_params()
    sets = {"mlp": mlp * 4, "resnet50": RESNET50_PARAMS * 4}

    fits = [fit_group(g, a.shm_busbw_gbs, impls) for g in sweep["groups"]]
    n = sweep["ranks"]
    print(f"# Ring model fit: {rel(path)}\n")
    print(f"{sweep['hosts']} hosts x {sweep['per_host']} ranks (n = {n}), "
          f"median over {sweep['rounds']} rounds; machine load "
          f"{sweep['machine'].get('load_avg_at_start')} at the start, "
          f"{sweep['machine'].get('load_avg_at_end')} at the end "
          f"({sweep['machine'].get('cpu_count')} CPUs).\n")
    print("| rate | impl | model | alpha (us) | 1/beta (Gbit/s) | of link "
          "| rms err | max err |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for f in fits:
        for impl, x in f["fits"].items():
            print(f"| {f['rate']} | {impl} | {x['model']} | "
                  f"{fmt(x.get('alpha_us'), '.1f', 1)} | "
                  f"{fmt(x.get('bandwidth_gbit'), '.3f', 1)} | "
                  f"{fmt(x.get('of_link'), '.0%', 1)} | "
                  f"{x['rms_err_pct']:.0f}% | {x['max_abs_err_pct']:.0f}% |")
    print("\nhier_from_flat: the hierarchical time predicted from the flat "
          "fit's alpha and beta (not fitted to the hierarchical curve), "
          "local stages at "
          + (f"{a.shm_busbw_gbs:g} GB/s busbw." if a.shm_busbw_gbs
             else "no cost."))
    for f in fits:
        cols = [k for k in ("flat", "torch", "hier", "hier_from_flat")
                if k in f["fits"]]
        print(f"\n## {f['rate']}: measured vs predicted time (us)\n")
        head = "| bytes |"
        rule = "|---:|"
        for k in cols:
            if k != "hier_from_flat":
                head += f" {k} meas |"
                rule += "---:|"
            head += f" {k} pred | err |"
            rule += "---:|---:|"
        print(head)
        print(rule)
        for r in f["sizes"]:
            line = f"| {size_label(r['bytes'])} |"
            for k in cols:
                if k != "hier_from_flat":
                    line += f" {r[k + '_measured_us']:.0f} |"
                line += (f" {r[k + '_predicted_us']:.0f} |"
                         f" {r[k + '_err_pct']:+.0f}% |")
            print(line)

    used, rows = extrapolate(fits, sets, compute, ranks, links, a.per_host,
                             a.shm_busbw_gbs, impls, alpha_us)
    print("\n# Extrapolation\n")
    print(f"- gradients, all-reduced once per step as one float32 buffer: "
          f"mlp {mlp:,} parameters ({sets['mlp'] / 1e6:.1f} MB; Linear "
          f"{', '.join(f'{i}x{o}' for i, o in layers)} with biases), "
          f"ResNet-50 {RESNET50_PARAMS:,} ({sets['resnet50'] / 1e6:.1f} MB).")
    print("- alpha (us per ring step, median of the fits over "
          f"{', '.join(f['rate'] for f in fits)}"
          + (f"; --alpha-us {a.alpha_us} given" if alpha_us else "") + "): " +
          ", ".join(f"{k} {v:.1f}" for k, v in used["alpha_us"].items()) +
          "; beta = 1 / link rate (the measured links reached the share of "
          "their rate in `of link` above: the extrapolation assumes the "
          "full rate).")
    print(f"- {a.per_host} ranks per host (--per-host), H = n / {a.per_host} "
          "hosts, all of them at the link rate at once; a flat ring crosses "
          "each host link once per direction whatever the ranks per host.")
    if "hier" in impls:
        print("- hier: cross rings at the flat fit's alpha; local stages "
              + (f"at {a.shm_busbw_gbs:g} GB/s busbw" if a.shm_busbw_gbs
                 else "free")
              + f" plus {used['hier_local_fixed_us']:.0f} us per call (the "
              "hierarchical fit's fixed cost beyond its cross latency).")
    print(f"- compute per step: mlp {compute['mlp']:g} ms, resnet50 "
          f"{compute['resnet50']:g} ms (--compute-ms). eff none: C / (C + T), "
          "no overlap; eff full: C / max(C, T), communication entirely "
          "hidden behind backward: the two bounds.")
    if "hier" in impls:
        print("- `hier local ms`: the share of hier's time in its local "
              "stages (--shm-busbw-gbs 0 takes out the bandwidth part); they "
              "run before and after the cross rings, not beside them, while "
              "a flat ring's edges within a host run beside its cross edges. "
              "On a server with more memory bandwidth than this 2-core "
              "machine they cost less.")
    print("- not modelled: switch contention and oversubscription (every "
          "host link at full rate at once), stragglers, Gloo's chunking and "
          "threads, fusion into several buffers, wire compression (fp16 "
          "halves S).")
    for name in sets:
        for gbit in links:
            sub = [r for r in rows if r["set"] == name and r["link_gbit"] == gbit]
            print(f"\n## {name}, {gbit:g} Gbit/s, compute "
                  f"{compute[name]:g} ms\n")
            local = ["hier"] if "hier" in impls else []
            print("| ranks |" + "".join(f" {i} ms |" for i in impls) +
                  "".join(" hier local ms |" for _ in local) +
                  "".join(f" {i} eff none | {i} eff full |" for i in impls))
            print("|---:|" + "---:|" * (3 * len(impls) + len(local)))
            for r in sub:
                line = f"| {r['ranks']} |"
                line += "".join(f" {fmt(r.get(i + '_ms'), '.1f', 1)} |"
                                for i in impls)
                line += "".join(f" {fmt(r.get('hier_local_ms'), '.1f', 1)} |"
                                for _ in local)
                line += "".join(
                    f" {fmt(r.get(i + '_eff_none'), '.0%', 1)} |"
                    f" {fmt(r.get(i + '_eff_full'), '.0%', 1)} |"
                    for i in impls)
                print(line)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "fit-scaling",
                       "sweep": rel(path),
                       "fits": fits,
                       "extrapolation": {
                           "sets_bytes": sets, "mlp_layers": layers,
                           "compute_ms": compute, "ranks": ranks,
                           "links_gbit": links, "per_host": a.per_host,
                           "shm_busbw_GBs": a.shm_busbw_gbs,
                           "alpha_us_given": alpha_us, **used,
                           "rows": rows}}, f, indent=1)
        print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
