#!/usr/bin/python3
"""Turns the raw outputs of bench/run into CSVs, plots, ratios.json and bench/REPORT.md, and
compares a quick run's ratios with the committed ones.

  report.py full  --results bench/results --report bench/REPORT.md
  report.py quick --results build-bench/quick-results [--baseline ratios.json]

Only ratios measured within one run are judged; absolute times appear as data, never as bars.
Formulas: docs/benchmarks.md.
"""
import argparse
import csv
import glob
import json
import math
import os
import statistics
import sys

# ---------------------------------------------------------------- reading raw outputs


def read_kv(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def read_reruns(path):
    """The rerun blocks of machine.txt (bench/run --only appends one per suite set, rerun_date
    first), each as a dict without the rerun_ prefix, oldest first."""
    blocks = []
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("rerun_") and "=" in line:
                k, v = line[len("rerun_"):].rstrip("\n").split("=", 1)
                if k == "date":
                    blocks.append({})
                if blocks:
                    blocks[-1][k] = v
    return blocks


def read_tsv(path):
    if not os.path.exists(path):
        return []
    return [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.startswith("{")]


def read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def median(v):
    return statistics.median(v) if v else float("nan")


def spread(v):
    return (max(v) - min(v)) if v else float("nan")


def gbench_runs(data):
    """Google Benchmark JSON -> {run name: [per-repetition dicts]} (aggregates dropped)."""
    runs = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b["name"])
        runs.setdefault(name, []).append(b)
    return runs


# ---------------------------------------------------------------- suites -> rows


def attention_rows(data):
    """Per (pass, kind, NP): medians and per-rep ratios of the kernel (and layer) benchmark."""
    rows = []
    for name, reps in gbench_runs(data).items():
        parts = dict(p.split(":") for p in name.split("/")[1:] if ":" in p)
        if name.startswith("BM_attention_"):
            phase = "fwd" if "forward" in name else "bwd"
            np_ = int(parts["NP"])
        elif name.startswith("BM_layer_forward_backward"):
            phase, np_ = "layer fwd+bwd", 8192  # N = 4096, P = 2
        else:
            continue
        kind = "window" if parts.get("window") == "1" else "global"
        ratios = [r["ratio"] for r in reps]
        rows.append({
            "phase": phase, "kind": kind, "NP": np_, "reps": len(reps),
            "ms": median([r["real_time"] for r in reps]),
            "GFLOPs": median([r["GFLOPs"] for r in reps]),
            "sgemm_GFLOPs": median([r["sgemm_GFLOPs"] for r in reps]),
            "ratio": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_reps": ratios,
            "computed_per_visible": median([r.get("computed_per_visible", float("nan")) for r in reps]),
            "label": reps[0].get("label", ""),
        })
    order = {"fwd": 0, "bwd": 1, "layer fwd+bwd": 2}
    rows.sort(key=lambda r: (order[r["phase"]], r["kind"], r["NP"]))
    return rows


CPU_LEVELS = ("avx2", "avx512")


def level_rows(results):
    """The levels suite: per CPU level, its bench_attention rows (attention_rows, plus the
    CPU-time ratio), the PyTorch peer record and the load average around the level's runs."""
    loads = {x[0]: x[1:] for x in read_tsv(os.path.join(results, "levels_load.tsv")) if x}
    out = []
    for level in CPU_LEVELS:
        data = read_json(os.path.join(results, f"levels_{level}.json"))
        load = loads.get(level, [])
        if not data:
            if load and load[0].startswith("skipped"):
                out.append({"level": level, "skipped": load[0]})
            continue
        rows = attention_rows(data)
        runs = gbench_runs(data)
        for r in rows:
            for name, reps in runs.items():
                if name.startswith("BM_layer_forward_backward" if r["phase"] == "layer fwd+bwd" else
                                   f"BM_attention_{'forward' if r['phase'] == 'fwd' else 'backward'}/NP:{r['NP']}/"):
                    cpu = [x["ratio_cpu"] for x in reps if "ratio_cpu" in x]
                    r["ratio_cpu"] = median(cpu) if cpu else float("nan")
                    r["ms_reps"] = [x["real_time"] for x in reps]
                    r["cpu_s_reps"] = [x["work_cpu_s"] for x in reps if "work_cpu_s" in x]
        peer = read_json(os.path.join(results, f"levels_peer_{level}.json"))
        out.append({"level": level, "rows": rows, "peer": peer, "context": data["context"],
                    "load_before": load[0] if load else "?", "load_after": load[1] if len(load) > 1 else "?"})
    return out


def peer_ratio(lv, cpu=False):
    """(median, min, max) of PyTorch peer time / layer time (wall, or process CPU time), or None:
    medians over each side's repetitions, the range from the fastest and slowest of each."""
    peer = lv.get("peer") or {}
    lay = [r for r in lv.get("rows", []) if r["phase"] == "layer fwd+bwd"]
    if not lay:
        return None
    p = peer.get("cpu_seconds" if cpu else "seconds")
    ms = lay[0].get("cpu_s_reps") if cpu else [t / 1000 for t in lay[0]["ms_reps"]]
    if not p or not ms:
        return None
    return (median(p) / median(ms), min(p) / max(ms), max(p) / min(ms))


STACK_KINDS = {"BM_MhaStack": "mha_stack", "BM_IhaStackMhaGlobal": "iha_stack_mha_global",
               "BM_IhaStackIhaGlobal": "iha_stack_iha_global"}


def stack_rows(data):
    """Per (N, P): time ratios IHA stack / MHA stack, per repetition index and median."""
    by = {}
    for name, reps in gbench_runs(data).items():
        fam, n, p = name.split("/")[:3]
        if fam not in STACK_KINDS:
            continue
        by.setdefault((int(n), int(p)), {})[STACK_KINDS[fam]] = reps
    rows = []
    for (n, p), fams in sorted(by.items()):
        if "mha_stack" not in fams:
            continue
        mha = fams["mha_stack"]
        for kind in ("iha_stack_mha_global", "iha_stack_iha_global"):
            if kind not in fams:
                continue
            iha = fams[kind]
            k = min(len(iha), len(mha))
            pair = [iha[i]["real_time"] / mha[i]["real_time"] for i in range(k)]
            pred = iha[0]["pred_ratio"]
            rows.append({
                "N": n, "P": p, "global": "mha" if kind == "iha_stack_mha_global" else "iha", "reps": k,
                "mha_ms": median([r["real_time"] for r in mha]), "iha_ms": median([r["real_time"] for r in iha]),
                "ratio": median(pair), "ratio_min": min(pair), "ratio_max": max(pair), "ratio_reps": pair,
                "pred": pred, "gap": median(pair) / pred - 1,
                "mha_attn_GFLOPs": median([r["attn_GFLOPs"] for r in mha]),
                "iha_attn_GFLOPs": median([r["attn_GFLOPs"] for r in iha]),
            })
    return rows


def seqpar_rows(results):
    rows = []
    for path in sorted(glob.glob(os.path.join(results, "seqpar_R*_NP*.json"))):
        for r in read_json(path):
            R = r["ranks"]
            ef = [a / (R * b) for a, b in zip(r["t1_fwd_all"], r["tr_fwd_all"])]
            eb = [a / (R * b) for a, b in zip(r["t1_bwd_all"], r["tr_bwd_all"])]
            xf = [w / t for w, t in zip(r["wait_fwd_all"], r["tr_fwd_all"])]
            xb = [w / t for w, t in zip(r["wait_bwd_all"], r["tr_bwd_all"])]
            r = dict(r)
            r.update(NP=r["N"] * r["P"], eff_fwd_reps=ef, eff_bwd_reps=eb, exposed_fwd_reps=xf, exposed_bwd_reps=xb,
                     scheme=r.get("scheme", "sequence"))
            # CPU-time efficiency C1 / (R CR) (absent from outputs older than the CPU clocks).
            if "cr_fwd_all" in r:
                r["eff_cpu_fwd_reps"] = [a / (R * b) for a, b in zip(r["c1_fwd_all"], r["cr_fwd_all"])]
                r["eff_cpu_bwd_reps"] = [a / (R * b) for a, b in zip(r["c1_bwd_all"], r["cr_bwd_all"])]
                r["eff_cpu_fb"] = (r["c1_fwd"] + r["c1_bwd"]) / (R * (r["cr_fwd"] + r["cr_bwd"]))
                # on-CPU fraction: the T1 run's, and the smallest rank's in the R-rank run.
                r["oncpu_t1"] = median([c / t for c, t in zip(r["c1_fwd_all"] + r["c1_bwd_all"],
                                                              r["t1_fwd_all"] + r["t1_bwd_all"])])
                r["oncpu_tr"] = min(r["oncpu_fwd"], r["oncpu_bwd"])
            else:
                r["eff_cpu_fwd_reps"] = r["eff_cpu_bwd_reps"] = []
                r["eff_cpu_fwd"] = r["eff_cpu_bwd"] = r["eff_cpu_fb"] = r["oncpu_t1"] = r["oncpu_tr"] = float("nan")
            r["min_fwd"], r["min_bwd"] = premix_minimum(r)
            rows.append(r)
    rows.sort(key=lambda r: (r["layer"], r["scheme"], r["ranks"], r["NP"]))
    return rows


def mesh_rows(results):
    """bench_mesh_layer outputs, one a rank count: (rows, fastest) with the rank count on each."""
    rows, fastest = [], []
    for path in sorted(glob.glob(os.path.join(results, "mesh_R*.json"))):
        m = read_json(path)
        if not m:
            continue
        for r in m["rows"]:
            rows.append(dict(r, ranks=m["ranks"], d=m["d"], reps=m["reps"]))
        fastest += m["fastest"]
    return rows, fastest


def chunk_begin(N, C, c):
    base, extra = divmod(N, C)
    return c * base + min(c, extra)


def premix_minimum(r):
    """The algorithm's minimum traffic, bytes summed over ranks: every rank receives, once, the
    pre-mix K_m, V_m (2*H*d values a token) of each token held elsewhere that one of its queries
    can see, and in backward returns their dK, dV once (the same count). DESIGN.md section 9."""
    N, R, P, H, d, B = r["N"], r["ranks"], r["P"], r["H"], r["d"], r["B"]
    wv = r.get("window_virtual", 0)
    zig = r.get("layout", "zigzag") == "zigzag"
    C = 2 * R if zig else R
    # Token u is visible to token n (some virtual pair) iff u <= n and, with a window,
    # n - u <= floor((Wv + P - 2) / P) (the closest pair: t = nP, t' = uP + P - 1).
    reach = (wv + P - 2) // P if wv > 0 else None
    total = 0
    for rank in range(R):
        chunks = [rank, 2 * R - 1 - rank] if zig else [rank]
        own = [(chunk_begin(N, C, c), chunk_begin(N, C, c + 1)) for c in chunks]
        need = []
        for a, b in own:
            if b > a:
                need.append((0 if reach is None else max(0, a - reach), b))
        # Union of the needed ranges minus the own ranges (all intervals, small lists).
        marks = sorted(set([x for iv in need + own for x in iv]))
        count = 0
        for lo, hi in zip(marks, marks[1:]):
            mid = lo
            if any(a <= mid < b for a, b in need) and not any(a <= mid < b for a, b in own):
                count += hi - lo
        total += count
    per_token = 2 * H * d * 4 * B  # float32 K and V, all heads, pre-mix
    return total * per_token, total * per_token


def checkpoint_rows(results, pattern="checkpoint_R*.json"):
    rows = []
    for path in sorted(glob.glob(os.path.join(results, pattern))):
        c = read_json(path)
        tw = [min(a, b) for a, b in zip(c["t_write"], c["t_write_presized"])]
        c["save_ratio_reps"] = [w / s for w, s in zip(tw, c["t_save"])]
        c["load_ratio_reps"] = [r / l for r, l in zip(c["t_read"], c["t_load"])]
        rows.append(c)
    return rows


# ---------------------------------------------------------------- quick metrics (ratios.json)


def quick_metrics(q):
    """The ratios the quick set measures: name -> {reps, better, what}."""
    m = {}

    def add(name, reps, better, what, oncpu=None, floor=0.0):
        reps = [float(x) for x in reps if x is not None and not math.isnan(x)]
        if reps:
            m[name] = {"median": median(reps), "spread": spread(reps), "reps": reps, "better": better, "what": what}
            if floor:
                # The smallest change the measurement resolves: a timed share whose repetitions
                # all read ~0 has spread 0, and 0.001 more would be no regression.
                m[name]["floor"] = floor
            if oncpu is not None:
                # Wall-time metric: the smallest on-CPU fraction of its run says whether other
                # work took the cores while it was measured.
                m[name]["oncpu"] = oncpu

    a = read_json(os.path.join(q, "attention.json"))
    if a:
        for r in attention_rows(a):
            if r["phase"] == "layer fwd+bwd":
                add(f"layer.fwdbwd.{r['kind']}.N4096", r["ratio_reps"], "higher",
                    "single-device layer fwd+bwd GFLOP/s / sgemm GFLOP/s (same iterations)")
            else:
                add(f"attention.{r['phase']}.{r['kind']}.NP{r['NP']}", r["ratio_reps"], "higher",
                    "flash kernel GFLOP/s (visible pairs) / sgemm GFLOP/s (same iterations)")
    s = read_json(os.path.join(q, "stack.json"))
    if s:
        for r in stack_rows(s):
            add(f"stack.{r['global']}_global.N{r['N']}.P{r['P']}", r["ratio_reps"], "lower",
                f"time IHA 4:1 stack ({r['global']} global) / 5 causal MHA layers (predicted {r['pred']:.3f})")
    for r in seqpar_rows(q):
        key = f"seqpar.R{r['ranks']}.NP{r['NP']}.{r['layer']}"
        on = None if math.isnan(r["oncpu_tr"]) else min(r["oncpu_t1"], r["oncpu_tr"])
        add(key + ".eff_fwd", r["eff_fwd_reps"], "higher", "T1 / (R TR), wall, forward", on)
        add(key + ".eff_bwd", r["eff_bwd_reps"], "higher", "T1 / (R TR), wall, backward", on)
        add(key + ".eff_cpu_fwd", r["eff_cpu_fwd_reps"], "higher", "C1 / (R CR), process CPU time, forward")
        add(key + ".eff_cpu_bwd", r["eff_cpu_bwd_reps"], "higher", "C1 / (R CR), process CPU time, backward")
        add(key + ".exposed_fwd", r["exposed_fwd_reps"], "lower", "blocked wait / TR, forward", on, floor=0.01)
        add(key + ".exposed_bwd", r["exposed_bwd_reps"], "lower", "blocked wait / TR, backward", on, floor=0.01)
        mn = r["min_fwd"] + r["min_bwd"]
        if mn > 0:
            add(key + ".bytes_over_min", [(r["bytes_fwd_sum"] + r["bytes_bwd_sum"]) / mn], "lower",
                "pre-mix bytes sent (all ranks, fwd+bwd) / algorithm minimum")
    for c in checkpoint_rows(q):
        add(f"checkpoint.R{c['ranks']}.save_ratio", c["save_ratio_reps"], "higher", "save GB/s / raw write GB/s")
        add(f"checkpoint.R{c['ranks']}.load_ratio", c["load_ratio_reps"], "higher", "load GB/s / raw read GB/s")
    mem = read_jsonl(os.path.join(q, "layer_memory.jsonl"))
    loc = [x["heap_delta_mib"] for x in mem if x["core"] == "local"]
    two = [x["heap_delta_mib"] for x in mem if x["core"] == "sp" and x["ranks"] == 2]
    if loc and two:
        n = mem[0]["N"]
        add(f"memory.layer.window.N{n}.R2_times_2_over_R1", [t * 2 / l for l, t in zip(loc, two)], "lower",
            "heap peak per rank on 2 ranks x 2 / single-device layer (1.0 = exact 1/R)")
    model = read_jsonl(os.path.join(q, "model.jsonl"))
    m1 = [x for x in model if x["ranks"] == 1]
    m2 = [x for x in model if x["ranks"] == 2]
    if m1 and m2:
        n = m1[0]["N"]
        add(f"model.N{n}.R2_activation_times_2_over_R1",
            [b["heap_activation_mib"] * 2 / a["heap_activation_mib"] for a, b in zip(m1, m2)], "lower",
            "model activation heap per rank on 2 ranks x 2 / 1 rank")
        add(f"model.N{n}.R2_step_efficiency", [a["step_s"] / (2 * b["step_s"]) for a, b in zip(m1, m2)], "higher",
            "model step time: T1 / (2 T2)")
    return m


ONCPU_JUDGED = 0.90  # below: a wall-time metric's run lost its cores to other work


def compare(base, now):
    """Rows (name, base, now, spread, change, verdict); a drop is flagged when it is larger
    than the spread (max - min) of this run's repetitions plus that of the baseline run's.
    Both spreads count because repetitions inside one run are correlated (one process, one
    cache and clock state): unchanged code measured twice on a calm machine moved
    attention.bwd.global.NP8192 from 0.976 to 0.934 with within-run spreads of 0.024 and
    0.019. Exact metrics (bytes, heap) have spread 0 and flag any change. A wall-time metric whose ranks were
    on a CPU less than ONCPU_JUDGED of the time is listed, not judged: its CPU-time twin
    (eff_cpu_*) is judged instead."""
    rows = []
    for name in sorted(set(base) | set(now)):
        b, n = base.get(name), now.get(name)
        if b is None or n is None:
            rows.append((name, b and b["median"], n and n["median"], n and n["spread"], None,
                         "new metric" if b is None else "not measured now"))
            continue
        worse = (b["median"] - n["median"]) if n["better"] == "higher" else (n["median"] - b["median"])
        tol = max(n["spread"] + b.get("spread", 0.0), n.get("floor", 0.0)) + 1e-9 * max(1.0, abs(b["median"]))
        verdict = "DROP" if worse > tol else "ok"
        if "oncpu" in n and n["oncpu"] < ONCPU_JUDGED:
            verdict = f"not judged (on-CPU {n['oncpu']:.2f}: load{'; would be DROP' if worse > tol else ''})"
        rows.append((name, b["median"], n["median"], tol, worse, verdict))
    return rows


# ---------------------------------------------------------------- plots

PLOT_DPI = 80


def machine_line(mach):
    return (f"Machine: {mach.get('cpu_model', '?')}, {mach.get('nproc', '?')} cores (nproc), "
            f"{mach.get('mem_total', '?')}; OpenBLAS core {mach.get('openblas_core_used', '?')}; "
            f"commit {mach.get('git_commit', '?')}, {mach.get('date', '?')}")


def command_line(commands, suite, limit=1):
    cmds = [c for s, c in commands if s == suite]
    if not cmds:
        return "bench/run"
    more = f" (+{len(cmds) - limit} more, see REPORT.md)" if len(cmds) > limit else ""
    return "bench/run -> " + "; ".join(cmds[:limit]) + more


def k_ticks(ax, values):
    """Log x axis labelled at the measured sizes (4k, 8k, ...), plain numbers on a log y axis."""
    import matplotlib.ticker as mt
    vals = sorted(set(values))
    if vals:
        ax.set_xticks(vals)
        ax.set_xticklabels([f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v) for v in vals])
        ax.xaxis.set_minor_locator(mt.NullLocator())
    if ax.get_yscale() == "log":
        ax.yaxis.set_major_formatter(mt.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(mt.FuncFormatter(lambda y, _: f"{y:g}" if str(f"{y:g}")[0] in "25" else ""))


def save_fig(fig, path, mach, commands, suite, baseline):
    import textwrap
    foot = [machine_line(mach), command_line(commands, suite), "Baseline: " + baseline]
    text = "\n".join(textwrap.fill(t, 150) for t in foot)
    nlines = text.count("\n") + 1
    # Footer height in figure units: 6.5 pt lines at 1.3 line spacing, plus a margin.
    h = (nlines * 6.5 * 1.3 / 72 + 0.1) / fig.get_figheight()
    import matplotlib.ticker as mt
    for ax in fig.axes:
        if ax.get_xscale() == "log":
            ax.xaxis.set_minor_formatter(mt.NullFormatter())
    fig.tight_layout(rect=(0, h, 1, 1))
    fig.text(0.01, 0.01, text, fontsize=6.5, va="bottom", ha="left", family="monospace")
    fig.savefig(path, dpi=PLOT_DPI)
    import matplotlib.pyplot as plt
    plt.close(fig)
    try:  # a 64-colour palette keeps the committed plots small (line art loses nothing visible)
        from PIL import Image
        Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)
    except ImportError:
        pass


def plots(results, mach, commands, att, stk, sp, mem, model, ckpt, pp):
    try:
        import matplotlib
    except ImportError:
        print("report.py: matplotlib is missing (scripts/install-deps.sh --bench): report without plots",
              file=sys.stderr)
        return {}
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pdir = os.path.join(results, "plots")
    os.makedirs(pdir, exist_ok=True)
    made = {}

    if att:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        for phase, mk in (("fwd", "o"), ("bwd", "s")):
            for kind, ls in (("global", "-"), ("window", "--")):
                rs = [r for r in att if r["phase"] == phase and r["kind"] == kind]
                if not rs:
                    continue
                x = [r["NP"] for r in rs]
                axes[0].plot(x, [r["GFLOPs"] for r in rs], ls, marker=mk, label=f"{phase} {kind}")
                axes[1].errorbar(x, [r["ratio"] for r in rs],
                                 yerr=[[r["ratio"] - r["ratio_min"] for r in rs], [r["ratio_max"] - r["ratio"] for r in rs]],
                                 fmt=ls, marker=mk, capsize=3, label=f"{phase} {kind}")
        sg = [r["sgemm_GFLOPs"] for r in att if r["phase"] != "layer fwd+bwd"]
        axes[0].axhline(median(sg), color="k", lw=1, label=f"sgemm n=1024 (median {median(sg):.0f})")
        axes[0].set(xscale="log", xlabel="N*P (virtual tokens)", ylabel="GFLOP/s (visible pairs)",
                    title="Flash attention throughput, 1 thread, fp32")
        axes[1].axhline(0.6, color="C0", lw=0.8, ls=":", label="target fwd 0.60 (N*P >= 8k)")
        axes[1].axhline(0.4, color="C1", lw=0.8, ls=":", label="target bwd 0.40 (N*P >= 8k)")
        axes[1].set(xscale="log", xlabel="N*P (virtual tokens)", ylabel="kernel / sgemm",
                    title="Ratio to sgemm (median, min-max bars)", ylim=(0, None))
        for ax in axes:
            k_ticks(ax, [r["NP"] for r in att if r["phase"] != "layer fwd+bwd"])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        made["attention"] = "attention.png"
        save_fig(fig, os.path.join(pdir, "attention.png"), mach, commands, "attention",
                 "single-thread OpenBLAS sgemm (1024^3) timed in the same iterations of the same binary")

    if stk:
        fig, ax = plt.subplots(figsize=(9, 4.4))
        labels, xs = [], []
        for i, r in enumerate(stk):
            labels.append(f"N={r['N']}\nP={r['P']}\n{r['global']} global")
            xs.append(i)
        ax.bar([x - 0.2 for x in xs], [r["pred"] for r in stk], 0.4, label="predicted (visible pairs)", color="0.7")
        ax.bar([x + 0.2 for x in xs], [r["ratio"] for r in stk], 0.4, label="measured (median time ratio)", color="C0",
               yerr=[[r["ratio"] - r["ratio_min"] for r in stk], [r["ratio_max"] - r["ratio"] for r in stk]], capsize=3)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set(ylabel="IHA stack / MHA stack", title="4:1 IHA stack (4 window + 1 global) vs 5 causal MHA layers, fwd+bwd")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
        made["stack"] = "stack.png"
        save_fig(fig, os.path.join(pdir, "stack.png"), mach, commands, "stack",
                 "5 global causal MHA layers (same N, D, H, d) timed in the same run")

    seq = [r for r in sp if r["scheme"] == "sequence"]
    if seq:
        fig, grid = plt.subplots(2, 3, figsize=(13, 8.4))
        panels = []
        for row, (pre, what) in enumerate((("eff", "wall"), ("eff_cpu", "CPU time"))):
            for col, (npx, title) in enumerate(((16384, "Strong scaling, N*P = 16384"),
                                                (32768, "Strong scaling, N*P = 32768"),
                                                (None, "Weak scaling, N*P = 8192 per rank"))):
                panels.append((npx, grid[row][col], f"{title}: {what}", pre))
        for npx, ax, title, pre in panels:
            for kind, c in (("global", "C0"), ("window", "C1")):
                for phase, ls in (("fwd", "-"), ("bwd", "--")):
                    if npx:
                        rs = [r for r in seq if r["layer"] == kind and r["NP"] == npx]
                    else:
                        rs = [r for r in seq if r["layer"] == kind and r["NP"] == 8192 * r["ranks"]]
                    rs.sort(key=lambda r: r["ranks"])
                    if not rs:
                        continue
                    e = [r[f"{pre}_{phase}"] for r in rs]
                    ax.plot([r["ranks"] for r in rs], e, ls, color=c, marker="o", label=f"{kind} {phase}")
                    x4 = [r for r in rs if r["ranks"] > int(mach.get("nproc", 2))]
                    if x4:
                        ax.plot([r["ranks"] for r in x4], [r[f"{pre}_{phase}"] for r in x4], "o", mfc="white", color=c)
            ax.axhline(0.85, color="k", lw=0.8, ls=":", label="target 0.85 (2 ranks, N*P >= 16k)")
            ax.set(xlabel="ranks R (hollow: more ranks than cores)",
                   ylabel="T1 / (R TR), wall" if pre == "eff" else "C1 / (R CR), process CPU time", title=title,
                   xticks=[1, 2, 4], xlim=(0.7, 4.3), ylim=(0, 1.15))
            ax.title.set_fontsize(9)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        made["scaling"] = "scaling.png"
        save_fig(fig, os.path.join(pdir, "scaling.png"), mach, commands, "seqpar",
                 "T1 (C1) = wall (CPU) time of the single-device layer (make_local_core) at the same N, rank 0 alone, same "
                 "repetition; TR (CR) = the slowest (most CPU-hungry) rank on R ranks. Top: wall, load-sensitive; "
                 "bottom: CPU time, robust to time-slicing by other work")

        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        rs = sorted([r for r in seq if r["ranks"] > 1], key=lambda r: (r["layer"], r["ranks"], r["NP"]))
        lab = [f"{r['layer'][0]} R{r['ranks']}\n{r['NP'] // 1024}k" for r in rs]
        x = list(range(len(rs)))
        axes[0].bar([i - 0.2 for i in x], [100 * r["exposed_fwd"] for r in rs], 0.4, label="forward")
        axes[0].bar([i + 0.2 for i in x], [100 * r["exposed_bwd"] for r in rs], 0.4, label="backward")
        axes[0].axhline(5, color="k", lw=0.8, ls=":", label="target 5% (window layers)")
        axes[0].set(ylabel="exposed communication, % of TR", title="Communication not hidden by compute")
        axes[1].bar([i - 0.2 for i in x], [(r["bytes_fwd_sum"] + r["bytes_bwd_sum"]) / max(1, r["min_fwd"] + r["min_bwd"]) for r in rs],
                    0.4, label="pre-mix, measured / minimum")
        alt = []
        for r in rs:
            ps = [p for p in sp if p["scheme"] == "pseudo" and p["layer"] == r["layer"] and p["ranks"] == r["ranks"] and p["NP"] == r["NP"]]
            if ps:
                alt.append((ps[0]["bytes_fwd_sum"] + ps[0]["bytes_bwd_sum"]) / max(1, r["min_fwd"] + r["min_bwd"]))
            elif r["layer"] == "window":
                alt.append(r["alt_bytes"] * r["ranks"] / max(1, r["min_fwd"] + r["min_bwd"]))
            else:
                alt.append(float("nan"))
        axes[1].bar([i + 0.2 for i in x], alt, 0.4, label="pseudo-head (measured; window w/o run: all-gather formula)")
        axes[1].axhline(1, color="k", lw=0.8)
        axes[1].set(yscale="log", ylabel="bytes / algorithm minimum", title="Bytes sent, all ranks, fwd+bwd")
        for ax in axes:
            ax.set_xticks(x)
            ax.set_xticklabels(lab, fontsize=7)
            ax.grid(alpha=0.3, axis="y")
            ax.legend(fontsize=7)
        made["comm"] = "comm.png"
        save_fig(fig, os.path.join(pdir, "comm.png"), mach, commands, "seqpar",
                 "exposed share: the layer's own time TR; bytes: the algorithm's minimum (pre-mix K/V of needed tokens, once each way)")

    if mem:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        for ax, kind in zip(axes, ("window", "global")):
            for lab, sel, st in (("1 device (local core)", lambda x: x["core"] == "local", "k-"),
                                 ("R=1 (sp core)", lambda x: x["core"] == "sp" and x["ranks"] == 1, "C0--"),
                                 ("R=2", lambda x: x["core"] == "sp" and x["ranks"] == 2, "C1-"),
                                 ("R=4", lambda x: x["core"] == "sp" and x["ranks"] == 4, "C2-")):
                rs = sorted([x for x in mem if x["kind"] == kind and sel(x)], key=lambda x: x["N"])
                if rs:
                    ax.plot([x["N"] for x in rs], [x["heap_delta_mib"] for x in rs], st, marker="o", label=lab)
            ref = sorted([x for x in mem if x["kind"] == kind and x["core"] == "local"], key=lambda x: x["N"])
            for R, c in ((2, "C1"), (4, "C2")):
                if ref:
                    ax.plot([x["N"] for x in ref], [x["heap_delta_mib"] / R for x in ref], ":", color=c, lw=0.8,
                            label=f"1 device / {R}")
            wv = ref[0]["window_virtual"] if ref else 0
            ax.set(xscale="log", yscale="log", xlabel="context N (tokens), P = 2", ylabel="peak heap per rank (MiB)",
                   title=f"One {kind} layer fwd+bwd" + (f" (Wv = {wv})" if kind == "window" else ""))
            k_ticks(ax, [x["N"] for x in mem if x["kind"] == kind])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        made["memory"] = "memory.png"
        save_fig(fig, os.path.join(pdir, "memory.png"), mach, commands, "memory",
                 "the single-device layer (local core) at the same N; dotted: its value / R")

    if model:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        for R, c in ((1, "k"), (2, "C1"), (4, "C2")):
            rs = sorted([x for x in model if x["ranks"] == R], key=lambda x: x["N"])
            if rs:
                axes[0].plot([x["N"] for x in rs], [x["heap_activation_mib"] for x in rs], "-o", color=c, label=f"R={R}")
        base = {x["N"]: x for x in model if x["ranks"] == 1}
        for R, c in ((2, "C1"), (4, "C2")):
            rs = sorted([x for x in model if x["ranks"] == R and x["N"] in base], key=lambda x: x["N"])
            if rs:
                axes[1].plot([x["N"] for x in rs], [base[x["N"]]["step_s"] / (R * x["step_s"]) for x in rs], "-o", color=c,
                             label=f"R={R}" + (" (oversubscribed)" if R > int(mach.get("nproc", 2)) else ""))
        axes[0].set(xscale="log", yscale="log", xlabel="context N (tokens)", ylabel="activation heap per rank (MiB)",
                    title="Model: activation memory per rank")
        axes[1].set(xscale="log", xlabel="context N (tokens)", ylabel="T1 / (R TR), step time", ylim=(0, 1.15),
                    title="Model: step-time scaling efficiency")
        for ax in axes:
            k_ticks(ax, [x["N"] for x in model])
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        made["model"] = "model.png"
        save_fig(fig, os.path.join(pdir, "model.png"), mach, commands, "model",
                 "the same model on 1 rank at the same N, measured in the same run")

    if ckpt or pp:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        if ckpt:
            x = list(range(len(ckpt)))
            for off, key, lab in ((-0.2, "save", "save / raw write"), (0.2, "load", "load / raw read")):
                reps = [c[f"{key}_ratio_reps"] for c in ckpt]
                med = [c[f"{key}_ratio"] for c in ckpt]
                axes[0].bar([i + off for i in x], med, 0.4, label=lab,
                            yerr=[[max(0, m - min(r)) for m, r in zip(med, reps)], [max(0, max(r) - m) for m, r in zip(med, reps)]],
                            capsize=3)
            axes[0].axhline(0.5, color="k", lw=0.8, ls=":", label="target 0.5")
            axes[0].set_xticks(x)
            axes[0].set_xticklabels([f"{c['ranks']} rank(s)\n{c['bytes'] / 2**30:.2f} GiB" for c in ckpt])
            axes[0].set(ylabel="checkpoint GB/s / raw GB/s", title="Checkpoint vs raw disk (bars: per-rep min-max)")
            axes[0].legend(fontsize=7)
            axes[0].grid(alpha=0.3, axis="y")
        if pp:
            bw = [s / t / 1e9 for s, t in zip(pp["sizes"], pp["times_s"])]
            axes[1].plot(pp["sizes"], bw, "-o")
            axes[1].set(xscale="log", yscale="log", xlabel="message bytes", ylabel="GB/s (bytes / one-way time)",
                        title=f"MPI ping-pong (latency {pp['alpha_s'] * 1e6:.2f} us)")
            axes[1].grid(alpha=0.3)
        made["io"] = "io.png"
        save_fig(fig, os.path.join(pdir, "io.png"), mach, commands, "checkpoint",
                 "raw write+fsync (faster of plain / pre-sized file) and raw read (page cache dropped) of the same disk, same run")
    return made


# ---------------------------------------------------------------- the report


def fmt(x, p=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{p}f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_csv(path, rows, keys):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in rows:
            w.writerow([r.get(k, "") for k in keys])


def full(results, report_path):
    mach = read_kv(os.path.join(results, "machine.txt"))
    commands = [tuple(x) for x in read_tsv(os.path.join(results, "commands.tsv")) if len(x) == 2]
    suites = read_tsv(os.path.join(results, "suites.tsv"))
    att_data = read_json(os.path.join(results, "attention.json"))
    att = attention_rows(att_data) if att_data else []
    if att_data:
        mach["openblas_core_used"] = att_data["context"].get("openblas_core", "?")
        mach["flash_tile_kernels"] = att_data["context"].get("flash_tile_kernels", "?")
    stk_data = read_json(os.path.join(results, "stack.json"))
    stk = stack_rows(stk_data) if stk_data else []
    sp = seqpar_rows(results)
    mesh, mesh_fast = mesh_rows(results)
    mem = read_jsonl(os.path.join(results, "layer_memory.jsonl"))
    model = read_jsonl(os.path.join(results, "model.jsonl"))
    ckpt = checkpoint_rows(results)
    pp = read_json(os.path.join(results, "pingpong.json"))
    qm = quick_metrics(os.path.join(results, "quick"))
    lvl = level_rows(results)

    # CSVs (one a suite) and the regression baseline.
    write_csv(os.path.join(results, "attention.csv"), att,
              ["phase", "kind", "NP", "reps", "ms", "GFLOPs", "sgemm_GFLOPs", "ratio", "ratio_min", "ratio_max",
               "computed_per_visible"])
    write_csv(os.path.join(results, "stack.csv"), stk,
              ["N", "P", "global", "reps", "mha_ms", "iha_ms", "ratio", "ratio_min", "ratio_max", "pred", "gap",
               "mha_attn_GFLOPs", "iha_attn_GFLOPs"])
    write_csv(os.path.join(results, "seqpar.csv"), sp,
              ["layer", "scheme", "ranks", "N", "NP", "P", "H", "d", "layout", "window_virtual", "t1_fwd", "tr_fwd",
               "t1_bwd", "tr_bwd", "eff_fwd", "eff_bwd", "exposed_fwd", "exposed_bwd", "bytes_fwd_sum",
               "bytes_bwd_sum", "min_fwd", "min_bwd", "alt_bytes"])
    write_csv(os.path.join(results, "layer_memory.csv"), mem,
              ["kind", "core", "N", "ranks", "window_virtual", "local_tokens", "heap_delta_mib", "rss_delta_mib",
               "bytes_per_token"])
    write_csv(os.path.join(results, "checkpoint.csv"), ckpt,
              ["ranks", "bytes", "reps", "raw_write_GBps", "raw_write_presized_GBps", "raw_read_GBps", "save_GBps",
               "load_GBps", "save_ratio", "load_ratio"])
    if model:
        write_csv(os.path.join(results, "model.csv"), model, list(model[0].keys()))
    if qm:
        with open(os.path.join(results, "ratios.json"), "w") as f:
            json.dump({"generated": mach.get("date"), "machine": {k: mach.get(k) for k in ("cpu_model", "nproc", "git_commit")},
                       "command": "bench/run (quick set inside the full run)", "metrics": qm}, f, indent=1)

    made = plots(results, mach, commands, att, stk, sp, mem, model, ckpt, pp)
    rel = os.path.relpath(os.path.join(results, "plots"), os.path.dirname(os.path.abspath(report_path)))
    nproc = int(mach.get("nproc", "2"))

    def cmds(suite):
        c = [x for s, x in commands if s == suite]
        return "\n".join(["```"] + c + ["```"]) if c else "(not run)"

    def fig(key, caption):
        return f"![{caption}]({rel}/{made[key]})" if key in made else "(no data)"

    L = []
    L.append("# Benchmark report")
    L.append("")
    L.append("Generated by `bench/run` (see [docs/benchmarks.md](../docs/benchmarks.md) for what each number means "
             "and the formulas). Every figure is a ratio to a baseline measured in the same run on the same machine; "
             "absolute times are listed as data only, never judged.")
    L.append("")
    L.append("## Machine and run")
    L.append("")
    L.append(table(["item", "value"], [
        ["CPU (/proc/cpuinfo)", mach.get("cpu_model", "?")],
        ["cores (nproc)", mach.get("nproc", "?")],
        ["memory", mach.get("mem_total", "?")],
        ["OS / kernel", f"{mach.get('os', '?')} / {mach.get('kernel', '?')}"],
        ["compiler", mach.get("compiler", "?")],
        ["MPI", mach.get("mpi", "?")],
        ["OpenBLAS", f"{mach.get('openblas_pkg', '?')}; core used: **{mach.get('openblas_core_used', '?')}** "
                     f"(OPENBLAS_CORETYPE={mach.get('openblas_coretype_env', '?')}; inherited from the environment: "
                     f"{mach.get('openblas_coretype_inherited', '?')}; bench/run --blas-core {mach.get('blas_core_option', '?')})"],
        ["flash tile kernels", mach.get("flash_tile_kernels", "?")],
        ["threads", "1 per rank (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1, the library default)"],
        ["CUDA", mach.get("cuda", "?")],
        ["commit", mach.get("git_commit", "?")],
        ["date (UTC)", mach.get("date", "?")],
        ["command", f"`{mach.get('command', 'bench/run')}`"],
        ["total time", f"{int(mach['total_seconds']) // 60} min {int(mach['total_seconds']) % 60} s" if "total_seconds" in mach else "?"],
    ] + [["suites rerun later", f"{r.get('suites', '?')}: `{r.get('command', '?')}` at "
          f"{r.get('git_commit', '?')}, {r.get('date', '?')}, on {r.get('cpu_model', '?')} "
          f"({r.get('nproc', '?')} cores, AVX-512 {r.get('avx512', '?')})"
          + (" — **another CPU than the rest of this report**: compare those suites' ratios only with each other"
             if r.get("cpu_model") != mach.get("cpu_model") else "")]
         for r in read_reruns(os.path.join(results, "machine.txt"))]))
    L.append("")
    L.append("The machine is shared with other engineers' builds and tests; load average (1, 5, 15 min) before "
             f"and after each suite. The load after includes the suite's own processes (up to {nproc} busy "
             f"ranks here); a 1-minute load above about {nproc} after, or above {nproc - 1} before, means "
             "other work competed for the cores: read that suite's figures with it in mind.")
    L.append("")
    L.append("How to read it: the load average counts runnable processes. Before a suite, anything above "
             "0 is other people's work; after it, the suite's own ranks are included. The wall-time figures of "
             "a suite run under load are slowed by the other work, which is why the scaling section also gives "
             "a CPU-time efficiency and each row's on-CPU fraction (the measured share of wall time the ranks "
             "actually ran): trust those over the load average, which is a 1-minute smoothed machine-wide "
             "count.")
    L.append("")
    L.append(table(["suite", "duration", "load before", "load after"],
                   [[s[0], f"{float(s[2]) - float(s[1]):.0f} s", s[3], s[4]] for s in suites]))
    L.append("")

    # Targets.
    fails = read_tsv(os.path.join(results, "failures.tsv"))
    if fails:
        L.append("**Failed measurements in this run** (their sections are incomplete; logs in results/logs):")
        L.append("")
        L += [f"- {f[0]}: `{f[1]}`" for f in fails]
        L.append("")
    L.append("## Targets at a glance")
    L.append("")
    trows = []

    def verdict(ok):
        return "met" if ok else "**missed**"

    for phase, tgt in (("fwd", 0.6), ("bwd", 0.4)):
        for kind in ("global", "window"):
            rs = [r for r in att if r["phase"] == phase and r["kind"] == kind and r["NP"] >= 8192]
            if rs:
                lo = min(r["ratio"] for r in rs)
                trows.append([f"attention {phase} {kind} / sgemm, N*P >= 8k", f">= {tgt}",
                              ", ".join(f"{r['ratio']:.2f} ({r['NP'] // 1024}k)" for r in rs), verdict(lo >= tgt)])
    for lv in lvl:
        if "rows" not in lv:
            continue
        for phase, tgt in (("fwd", 0.8), ("bwd", 0.9)):
            rs = [r for r in lv["rows"] if r["phase"] == phase and r["kind"] == "global" and r["NP"] >= 8192]
            if rs:
                trows.append([f"level {lv['level']}: attention {phase} global / sgemm of the same width, N*P >= 8k",
                              f">= {tgt}", ", ".join(f"{r['ratio']:.2f} ({r['NP'] // 1024}k; CPU time {fmt(r['ratio_cpu'], 2)})"
                                                     for r in rs),
                              verdict(min(r["ratio"] for r in rs) >= tgt)])
        pr, pc = peer_ratio(lv), peer_ratio(lv, cpu=True)
        if pr:
            # The target is against the layer as a PyTorch user writes it today: with
            # scaled_dot_product_attention (torch >= 2), its GEMMs held to the level. A peer that
            # materialises the scores (torch 1.x), or whose MKL ran another instruction set, is
            # reported but judges nothing.
            peer = lv.get("peer") or {}
            comparable = (peer.get("attention") == "scaled_dot_product_attention" and
                          peer.get("mkl_instructions", "default") != "default")
            # The most this ratio could be on this machine: the layer's counted FLOPs all at the
            # sgemm rate of the same run (time x ratio), everything uncounted free.
            lay = [r for r in lv["rows"] if r["phase"] == "layer fwd+bwd"]
            bound = pr[0] / lay[0]["ratio"] if lay and lay[0]["ratio"] > 0 else None
            trows.append([f"level {lv['level']}: PyTorch peer / layer time (N 4096, fwd+bwd)", ">= 1.5",
                          f"{pr[0]:.2f} ({pr[1]:.2f}..{pr[2]:.2f})" +
                          (f"; CPU time {pc[0]:.2f} ({pc[1]:.2f}..{pc[2]:.2f})" if pc else "") +
                          (f"; at most {bound:.2f} with the layer at sgemm speed" if bound else "") +
                          ("" if comparable else f"; peer: torch {peer.get('torch_version', '?')}, "
                           f"{peer.get('attention', '?')}, MKL {peer.get('mkl_instructions', 'not held to the level')}"),
                          verdict(pr[0] >= 1.5) if comparable else
                          "not judged: the peer lacks SDPA or its MKL was not held to the level"])
    for kind in ("global", "window"):
        rs = [r for r in sp if r["scheme"] == "sequence" and r["layer"] == kind and r["ranks"] == 2 and r["NP"] >= 16384]
        if rs:
            vals = [min(r["eff_fwd"], r["eff_bwd"]) for r in rs]
            cvals = [min(r["eff_cpu_fwd"], r["eff_cpu_bwd"]) for r in rs]
            oncpu = min(min(r["oncpu_t1"], r["oncpu_tr"]) for r in rs)
            meas = "; ".join(f"{r['NP'] // 1024}k: wall {r['eff_fwd']:.2f}, {r['eff_bwd']:.2f}; "
                             f"CPU {fmt(r['eff_cpu_fwd'], 2)}, {fmt(r['eff_cpu_bwd'], 2)}" for r in rs)
            v = f"wall: {verdict(min(vals) >= 0.85)}"
            if not any(math.isnan(x) for x in cvals):
                v += f"; CPU: {verdict(min(cvals) >= 0.85)}"
            if not math.isnan(oncpu):
                v += (f" (on-CPU {oncpu:.2f}: " + ("wall trustworthy)" if oncpu >= 0.95 else
                                                   "other work took the cores, wall figure not the code's)"))
            trows.append([f"strong-scaling efficiency, {kind}, 2 ranks, N*P >= 16k (fwd, bwd)", ">= 0.85", meas, v])
    rs = [r for r in sp if r["scheme"] == "sequence" and r["layer"] == "window" and r["ranks"] == 2 and r["NP"] >= 16384]
    if rs:
        worst = max(max(r["exposed_fwd"], r["exposed_bwd"]) for r in rs)
        trows.append(["window layer exposed communication, 2 ranks (fwd, bwd)", "<= 5%",
                      ", ".join(f"{100 * r['exposed_fwd']:.1f}%, {100 * r['exposed_bwd']:.1f}% ({r['NP'] // 1024}k)" for r in rs),
                      verdict(worst <= 0.05)])
    for c in ckpt:
        trows.append([f"checkpoint save / raw write, {c['ranks']} rank(s)", ">= 0.5", f"{c['save_ratio']:.2f}",
                      verdict(c["save_ratio"] >= 0.5)])
        trows.append([f"checkpoint load / raw read, {c['ranks']} rank(s)", ">= 0.5", f"{c['load_ratio']:.2f}",
                      verdict(c["load_ratio"] >= 0.5)])
    for g, tgt in (("mha", 0.95), ("iha", 1.55)):
        rs = [r for r in stk if r["global"] == g and r["P"] == 2]
        if rs:
            trows.append([f"IHA stack ({g} global) / MHA stack, P = 2", f"~{tgt} (visible pairs)",
                          ", ".join(f"{r['ratio']:.2f} (N={r['N']})" for r in rs),
                          "see the stack section (prediction, not a bar)"])
    if mem:
        for kind in ("window", "global"):
            loc = {x["N"]: x for x in mem if x["kind"] == kind and x["core"] == "local"}
            rs = [x for x in mem if x["kind"] == kind and x["core"] == "sp" and x["ranks"] > 1 and x["N"] in loc]
            if rs:
                v = [x["heap_delta_mib"] * x["ranks"] / loc[x["N"]]["heap_delta_mib"] for x in rs]
                trows.append([f"layer memory per rank x R / single device ({kind})", "1/R (1.00)",
                              f"{min(v):.2f} .. {max(v):.2f}", "falls as 1/R; constant overhead factor, see memory"])
    if model:
        base = {x["N"]: x for x in model if x["ranks"] == 1}
        rs = [x for x in model if x["ranks"] > 1 and x["N"] in base and base[x["N"]]["heap_activation_mib"] > 0]
        if rs:
            v = [x["heap_activation_mib"] * x["ranks"] / base[x["N"]]["heap_activation_mib"] for x in rs]
            trows.append(["model activation memory per rank x R / 1 rank", "roughly 1/R",
                          f"{min(v):.2f} .. {max(v):.2f}", "falls as 1/R; constant overhead factor, see memory"])
    L.append(table(["what", "target", "measured", "verdict"], trows))
    L.append("")

    # Attention.
    L.append("## 1. Attention kernel efficiency against BLAS GEMM")
    L.append("")
    L.append("Flash attention on one head's virtual sequence (H = 4, d = 64, P = 2, fp32, one thread), forward "
             "and backward, global layers (flat causal) and window layers (Wv = N/(2P) virtual tokens). GFLOP/s "
             "count visible (query, key) pairs only: 4d FLOPs a pair forward, 10d backward; a computed masked "
             "pair is a cost, never work (`computed/visible` = pairs the kernel computed per visible pair). "
             "**Baseline**: single-thread OpenBLAS sgemm (n = 1024, 2n^3 FLOPs) timed in the same iterations "
             f"of the same binary; OpenBLAS core `{mach.get('openblas_core_used', '?')}`. Medians over repetitions; "
             "ratio range = min..max over repetitions.")
    L.append("")
    L.append(fig("attention", "attention throughput and ratio to sgemm"))
    L.append("")
    L.append(table(["pass", "layer", "N*P", "ms", "GFLOP/s", "sgemm GFLOP/s", "ratio", "ratio range", "computed/visible"],
                   [[r["phase"], r["kind"], r["NP"], fmt(r["ms"], 1), fmt(r["GFLOPs"], 1), fmt(r["sgemm_GFLOPs"], 1),
                     f"**{r['ratio']:.3f}**", f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f}",
                     fmt(r["computed_per_visible"])] for r in att]))
    L.append("")
    L.append("`layer fwd+bwd`: the whole single-device layer (N = 4096, D = 256, projections + attention FLOPs; "
             "mixing, RoPE and collapse are not counted, so it understates the work).")
    L.append("")
    L.append("Commands:")
    L.append(cmds("attention"))
    L.append("")

    # CPU levels.
    L.append("### CPU levels side by side (levels suite)")
    L.append("")
    L.append("The same binary at each CPU level (core/cpu_level.h; `IHA_CPU_LEVEL` forces one), each against "
             "OpenBLAS's sgemm kernels of the same vector width timed in the same iterations (Haswell for avx2, "
             "SkylakeX for avx512), one thread, global layers. `ratio cpu` is the same ratio on process CPU time "
             "(robust to other work taking the core). The layer row is the single-device layer (N = 4096, D = 256, "
             "H = 4, d = 64, P = 2) forward + backward; `peer` is bench/attention/torch_peer.py, the same layer "
             "written in PyTorch (autograd, one thread, same BLAS core), run right after it: peer / layer > 1 means "
             "the library is faster (its `ratio cpu`: the same on process CPU time). Medians over repetitions, "
             "ranges min..max; load average before and after each level's runs.")
    L.append("")
    if not lvl:
        L.append("(not run)")
    lrows = []
    for lv in lvl:
        if "rows" not in lv:
            lrows.append([lv["level"], lv.get("skipped", "?"), "", "", "", "", "", "", "", ""])
            continue
        core = lv["context"].get("openblas_core", "?")
        for r in lv["rows"]:
            if r["kind"] != "global":
                continue
            lrows.append([lv["level"], core, r["phase"], r["NP"], fmt(r["ms"], 1), fmt(r["GFLOPs"], 1),
                          fmt(r["sgemm_GFLOPs"], 1), f"**{r['ratio']:.3f}** ({r['ratio_min']:.3f}..{r['ratio_max']:.3f})",
                          fmt(r.get("ratio_cpu", float("nan"))), f"{lv['load_before']} / {lv['load_after']}"])
        peer = lv.get("peer") or {}
        pr, pc = peer_ratio(lv), peer_ratio(lv, cpu=True)
        if pr:
            lrows.append([lv["level"], core, "peer / layer", 8192, fmt(1000 * median(peer["seconds"]), 1), "", "",
                          f"**{pr[0]:.2f}** ({pr[1]:.2f}..{pr[2]:.2f})", fmt(pc[0], 2) if pc else "-",
                          f"torch {peer.get('torch_version', '?')}, {peer.get('attention', '?')}, "
                          f"ATen {peer.get('cpu_capability', '?')}, MKL {peer.get('mkl_instructions', 'not held')}"])
        elif "skipped" in peer:
            lrows.append([lv["level"], core, "peer / layer", "", "", "", "", "skipped", "", peer["skipped"]])
    if lrows:
        L.append(table(["level", "OpenBLAS core", "pass", "N*P", "ms", "GFLOP/s", "sgemm GFLOP/s", "ratio (range)",
                        "ratio cpu", "load before / after (or note)"], lrows))
    L.append("")
    busy = [lv for lv in lvl if "rows" in lv and lv["load_before"] != "?" and
            float(lv["load_before"].split()[0]) > nproc - 1]
    if busy:
        L.append(f"**Load:** the 1-minute load average before {', '.join(lv['level'] for lv in busy)} was above "
                 f"{nproc - 1} (other work on the {nproc} cores): the wall ratios (and their ranges) then measure "
                 "the competition more than the code; compare the levels on `ratio cpu`, measured in the same run.")
        L.append("")
    L.append("Commands:")
    L.append(cmds("levels"))
    L.append("")

    # Stack.
    L.append("## 2. IHA against MHA: the 4:1 stack")
    L.append("")
    L.append("Time of four sliding-window IHA layers (W = N/(2P^2) tokens) plus one global layer (`mha`: P = 1, "
             "or `iha`) against five global causal MHA layers, forward + backward, one thread (D = 256, H = 4, "
             "d = 64). **Baseline**: the MHA stack at the same N, in the same run (repetition i of each "
             "paired; median and min..max of the pairs). *Predicted* = visible pairs of the IHA stack / "
             "visible pairs of the MHA stack (DESIGN.md section 1). *Gap* = measured / predicted - 1: time "
             "the IHA stack spends beyond its share of visible pairs, i.e. work on masked or partly masked "
             "tiles of the window layers and the non-attention parts that grow with P (mixing, RoPE, "
             "interleave, collapse over N*P rows). *attn GFLOP/s* = visible-pair FLOPs / whole stack time.")
    L.append("")
    L.append(fig("stack", "IHA stack vs MHA stack, measured and predicted"))
    L.append("")
    L.append(table(["N", "P", "global", "MHA ms", "IHA ms", "measured", "range", "predicted", "gap", "attn GFLOP/s MHA", "attn GFLOP/s IHA"],
                   [[r["N"], r["P"], r["global"], fmt(r["mha_ms"], 0), fmt(r["iha_ms"], 0), f"**{r['ratio']:.3f}**",
                     f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f}", fmt(r["pred"]), f"{100 * r['gap']:+.1f}%",
                     fmt(r["mha_attn_GFLOPs"], 0), fmt(r["iha_attn_GFLOPs"], 0)] for r in stk]))
    L.append("")
    L.append("Commands:")
    L.append(cmds("stack"))
    L.append("")

    # Sequence parallel.
    L.append("## 3. Sequence-parallel scaling: ring (global) and halo (window) layers")
    L.append("")
    L.append("One IHA layer (D = 256, H = 4, d = 64, P = 2, zigzag layout, window layers Wv = N/(2P)), forward "
             "and backward, on R MPI ranks (one thread each). **Baseline** T1: the single-device layer "
             "(`make_local_core`) at the same N, run by rank 0 alone (the others sleeping) in the same "
             "repetition. Efficiency = T1 / (R * TR), TR the slowest rank; exposed = the slowest rank's time "
             "blocked waiting for transfers / TR (communication compute did not hide). Medians over the "
             f"repetitions. **R = 4 runs 4 ranks on {nproc} cores** (oversubscribed): those rows show trend and "
             "correctness of the code path, not efficiency (at best 0.5 here). Weak scaling keeps N*P = 8192 "
             "per rank (so N*P = 8k, 16k, 32k on 1, 2, 4 ranks); its efficiency uses T1 at the grown N.")
    L.append("")
    L.append("**Two efficiencies, because the machine is shared.** *Wall* = T1 / (R TR) is what a user "
             "experiences, but on a shared machine a rank that other work pushes off its core makes TR "
             "longer, and the slowest rank decides, so the wall figure measures the neighbours as much as the "
             "code. *CPU* = C1 / (R CR) is the same formula on the process CPU time of the same timed "
             "regions (C1: the single-device layer's, CR: the largest over ranks, medians over repetitions). "
             "Time a rank spends descheduled does not count, so it is **robust to time-slicing by other "
             "load**, and on an idle machine with R <= cores it equals the wall figure. It is not a "
             "flattering number: MPI waits busy-poll, so communication a rank waited for, and a peer that was "
             "descheduled while this rank spun, both count against it. It does not remove interference from "
             "work sharing the core's caches, memory bandwidth or an SMT sibling. *on-CPU* = CPU time / wall "
             "time of the region (T1's, and the smallest over the R ranks): 1.00 means the rank had its core "
             "throughout; below about 0.95 the wall efficiency of that row is corrupted by load and the CPU "
             "figure is the one to read. With R > cores (oversubscribed) both are for trend only.")
    L.append("")
    L.append(fig("scaling", "strong and weak scaling efficiency, wall and CPU time"))
    L.append("")
    seqrows = [r for r in sp if r["scheme"] == "sequence"]

    def rng(v):
        return f"{min(v):.2f}..{max(v):.2f}" if v else "-"

    L.append(table(["layer", "R", "N*P", "T1 fwd s", "TR fwd s", "T1 bwd s", "TR bwd s", "eff wall fwd", "eff wall bwd",
                    "eff CPU fwd", "eff CPU bwd", "range wall (fwd; bwd)", "range CPU (fwd; bwd)", "on-CPU T1; TR",
                    "exposed fwd", "exposed bwd", "reps"],
                   [[r["layer"], r["ranks"] if r["ranks"] <= nproc else f"{r['ranks']} (oversub.)", r["NP"], fmt(r["t1_fwd"]),
                     fmt(r["tr_fwd"]), fmt(r["t1_bwd"]), fmt(r["tr_bwd"]), f"**{r['eff_fwd']:.3f}**", f"**{r['eff_bwd']:.3f}**",
                     f"**{fmt(r['eff_cpu_fwd'])}**", f"**{fmt(r['eff_cpu_bwd'])}**",
                     f"{rng(r['eff_fwd_reps'])}; {rng(r['eff_bwd_reps'])}",
                     f"{rng(r['eff_cpu_fwd_reps'])}; {rng(r['eff_cpu_bwd_reps'])}",
                     f"{fmt(r['oncpu_t1'], 2)}; {fmt(r['oncpu_tr'], 2)}",
                     f"{100 * r['exposed_fwd']:.1f}%", f"{100 * r['exposed_bwd']:.1f}%", len(r["t1_fwd_all"])]
                    for r in seqrows]))
    L.append("")
    L.append("R = 1 rows run the sequence-parallel core on one rank: their efficiency is the cost of the "
             "ring/halo machinery itself against the single-device core.")
    L.append("")

    # Schemes.
    sch = [r for r in sp if r["ranks"] > 1 and any(p["scheme"] != "sequence" and p["ranks"] == r["ranks"] and p["NP"] == r["NP"] for p in sp)]
    if sch:
        L.append("### Which scheme wins where (pre-mix sequence, pseudo-head sequence, Ulysses head parallel)")
        L.append("")
        L.append("Same layer and ranks, three ways to share it: `sequence` = ring/halo exchanging pre-mix K/V "
                 "(the library's sequence-parallel default); `pseudo` = the same ring/halo exchanging pseudo-head "
                 "K/V (head scheme on a 1 x R mesh; what a head x sequence mesh must do); `ulysses` = head "
                 "parallelism over all R ranks (all-to-all of pseudo-heads, H/R whole heads a rank). Time = "
                 "TR fwd + TR bwd (median); bytes = sent by all ranks, fwd + bwd. **Baseline**: the same T1 "
                 "(single device) for efficiency.")
        L.append("")
        L.append(table(["layer", "R", "N*P", "scheme", "TR fwd+bwd s", "eff wall (fwd+bwd)", "eff CPU (fwd+bwd)",
                        "exposed fwd", "exposed bwd",
                        "MiB sent", "x pre-mix bytes", "fastest"],
                       [[r["layer"], r["ranks"], r["NP"], r["scheme"], fmt(r["tr_fwd"] + r["tr_bwd"]),
                         fmt((r["t1_fwd"] + r["t1_bwd"]) / (r["ranks"] * (r["tr_fwd"] + r["tr_bwd"]))),
                         fmt(r["eff_cpu_fb"]),
                         f"{100 * r['exposed_fwd']:.1f}%", f"{100 * r['exposed_bwd']:.1f}%",
                         fmt((r["bytes_fwd_sum"] + r["bytes_bwd_sum"]) / 2**20, 1),
                         fmt((r["bytes_fwd_sum"] + r["bytes_bwd_sum"]) / max(1, next(
                             (q["bytes_fwd_sum"] + q["bytes_bwd_sum"] for q in sp if q["scheme"] == "sequence"
                              and q["layer"] == r["layer"] and q["ranks"] == r["ranks"] and q["NP"] == r["NP"]), 0)), 2),
                         "yes" if r["tr_fwd"] + r["tr_bwd"] == min(q["tr_fwd"] + q["tr_bwd"] for q in sch
                                                                    if q["layer"] == r["layer"] and q["ranks"] == r["ranks"] and q["NP"] == r["NP"]) else ""]
                        for r in sorted(sch, key=lambda r: (r["ranks"], r["NP"], r["layer"], r["scheme"]))]))
        L.append("")
        L.append("On this machine the ranks share one memory system, so bytes cost little time; on a cluster the "
                 "byte column is the one that scales with the interconnect.")
        L.append("")

    # Head-parallel and 2D meshes.
    L.append("### Head-parallel and 2D meshes (bench_mesh_layer)")
    L.append("")
    if mesh:
        mranks = sorted(set(r["ranks"] for r in mesh))
        L.append("One IHA layer (forward + backward, fp32, zigzag, d = "
                 f"{mesh[0]['d']}, one sequence, window layers W = N/(2P^2)) spread over all R ranks four ways: "
                 "`seq` (scheme sequence, sp = R: pre-mix ring/halo), `head` (hp = R: Ulysses all-to-all of "
                 "pseudo-heads), `2d` (hp = 2, sp = R/2: all-to-all, then ring/halo of pseudo-head K/V) and "
                 "`pseq` (hp = 1, sp = R: ring/halo of pseudo-head K/V, the reference for the pre-mix saving). "
                 "Time = the slowest rank's forward + backward, median of "
                 f"{mesh[0]['reps']} repetitions after one warm-up (wall time: read it under the load table). "
                 "**Baseline** of *runner-up / fastest*: the fastest scheme's time at the same point, same run "
                 "(1.10 = the runner-up took 10% longer). MiB = bytes the busiest rank sent, forward + backward "
                 "(communicator counters: exact, machine-independent). On this machine communication goes "
                 "through shared memory, so time differences under ~15% are within run-to-run noise "
                 "(docs/training.md); trust the byte columns, which are what decides on a cluster. "
                 + ("**R = 4 runs 4 ranks on " + str(nproc) + " cores**: trend only. " if any(x > nproc for x in mranks) else ""))
        L.append("")

        def mib_of(r):
            return sum(v for k, v in r.items() if k.startswith("bytes_")) / 2**20

        by = {}
        for r in mesh:
            by.setdefault((r["layer"], r["N"], r["P"], r["H"], r["ranks"]), {})[r["scheme"]] = r
        mrows = []
        for f in sorted(mesh_fast, key=lambda f: (f["layer"], f["ranks"], f["N"], f["P"], f["H"])):
            pts = by.get((f["layer"], f["N"], f["P"], f["H"], f["ranks"]), {})
            best = pts.get(f["fastest"])
            if not best or f["ranks"] < 2:
                continue
            mrows.append([f["layer"], f["ranks"] if f["ranks"] <= nproc else f"{f['ranks']} (oversub.)", f["N"], f["P"],
                          f["H"], f"**{f['fastest']}**", fmt(best["total_s"]), f["runner_up"] or "-",
                          fmt(f["runner_up_ratio"], 2), f"{100 * best['exposed_s'] / max(best['total_s'], 1e-12):.0f}%"]
                         + [fmt(mib_of(pts[s]), 1) if s in pts else "-" for s in ("seq", "head", "2d", "pseq")]
                         + [f["fewest_bytes"]])
        L.append(table(["layer", "R", "N", "P", "H", "fastest", "its time s", "runner-up", "runner-up / fastest",
                        "exposed (fastest)", "seq MiB", "head MiB", "2d MiB", "pseq MiB", "fewest bytes"], mrows))
        L.append("")
        L.append("Commands:")
        L.append(cmds("mesh"))
    else:
        L.append("(not run: the `mesh` suite)")
    L.append("")

    # Bytes.
    L.append("## 4. Bytes moved")
    L.append("")
    L.append("Bytes sent, summed over all ranks, forward + backward, as the communicator counted them (exact "
             "payloads). **Baseline**: the algorithm's minimum, computed in the report from the layout and the "
             "mask (not from the library's maps): each rank receives once the pre-mix K/V (2*H*d fp32 values a "
             "token) of every token held elsewhere that one of its queries can see, and returns their dK/dV "
             "once. Pseudo-head = measured with the pseudo-head exchange where it ran; all-gather = the "
             "formula for an all-gather of pseudo-head K/V in forward plus a reduce-scatter of their gradients "
             "in backward (what other systems do for sliding windows).")
    L.append("")
    L.append(fig("comm", "exposed communication and bytes against the minimum"))
    L.append("")
    brow = []
    for r in seqrows:
        if r["ranks"] < 2:
            continue
        mn = r["min_fwd"] + r["min_bwd"]
        got = r["bytes_fwd_sum"] + r["bytes_bwd_sum"]
        ps = [p for p in sp if p["scheme"] == "pseudo" and p["layer"] == r["layer"] and p["ranks"] == r["ranks"] and p["NP"] == r["NP"]]
        pse = (ps[0]["bytes_fwd_sum"] + ps[0]["bytes_bwd_sum"]) / got if ps else None
        ag = r["alt_bytes"] * r["ranks"] / got if r["layer"] == "window" else None
        brow.append([r["layer"], r["ranks"], r["NP"], fmt(r["bytes_fwd_sum"] / 2**20, 1), fmt(r["bytes_bwd_sum"] / 2**20, 1),
                     fmt(r["min_fwd"] / 2**20, 1), fmt(r["min_bwd"] / 2**20, 1), f"**{r['bytes_fwd_sum'] / max(1, r['min_fwd']):.2f}**",
                     f"**{r['bytes_bwd_sum'] / max(1, r['min_bwd']):.2f}**", fmt(pse, 2), fmt(ag, 2)])
    L.append(table(["layer", "R", "N*P", "fwd MiB", "bwd MiB", "min fwd MiB", "min bwd MiB", "fwd / min", "bwd / min",
                    "pseudo-head / pre-mix", "all-gather / halo"], brow))
    L.append("")
    L.append("Commands:")
    L.append(cmds("seqpar"))
    L.append("")

    # Memory.
    L.append("## 5. Memory per rank against context length")
    L.append("")
    L.append("### One layer, forward + backward (bench_layer_memory)")
    L.append("")
    L.append("Peak of the allocator's bytes in use during one layer forward + backward, minus before (inputs, "
             "weights, gradient buffers allocated before; glibc mallinfo2 sampled every 0.1 ms), max over "
             "ranks: the memory the layer itself needs. One process per point. Window layers use a fixed small "
             "window (Wv = 256 virtual tokens) so that 64k tokens stay cheap to compute; what a layer holds does "
             "not depend on the window beyond its halo. **Baseline**: the single-device layer (local core) at "
             "the same N; *x R / 1 device* = 1.00 is exact 1/R scaling, above 1 is the sequence-parallel "
             "cores' constant overhead (exchange buffers, visiting blocks).")
    L.append("")
    L.append(fig("memory", "layer memory per rank against N"))
    L.append("")
    if mem:
        loc = {(x["kind"], x["N"]): x for x in mem if x["core"] == "local"}
        mrows = []
        for x in sorted(mem, key=lambda x: (x["kind"], x["N"], x["core"] != "local", x["ranks"])):
            b = loc.get((x["kind"], x["N"]))
            mrows.append([x["kind"], x["N"], x["N"] * x["P"], x["core"], x["ranks"], fmt(x["heap_delta_mib"], 1),
                          fmt(x["rss_delta_mib"], 1), fmt(x["bytes_per_token"] / 1024, 1),
                          f"**{x['heap_delta_mib'] * x['ranks'] / b['heap_delta_mib']:.2f}**" if b else "-"])
        L.append(table(["layer", "N", "N*P", "core", "R", "heap peak MiB", "RSS peak MiB", "KiB / local token",
                        "x R / 1 device"], mrows))
    L.append("")
    L.append("Commands:")
    L.append(cmds("memory"))
    L.append("")
    L.append("### The model (bench/model, issue 5)")
    L.append("")
    if model:
        L.append("The demo model (configs/demo.yaml), one sequence of N tokens a step, sequence-parallel over R "
                 "ranks, activation recomputation on, fp32. Heap activation = the allocator's bytes in use at "
                 "the peak of a step minus before it. **Baselines**: R = 1 at the same N (x R / R=1 = 1.00 is "
                 "exact 1/R; step efficiency = T1 / (R TR)). R = 4 is oversubscribed.")
        L.append("")
        L.append(fig("model", "model memory and step-time efficiency"))
        L.append("")
        base = {x["N"]: x for x in model if x["ranks"] == 1}
        L.append(table(["N", "R", "static MiB", "peak RSS MiB", "heap act. MiB", "x R / R=1", "step s", "T1 / (R TR)"],
                       [[x["N"], x["ranks"], fmt(x["static_mib"], 1), fmt(x["peak_mib"], 1), fmt(x["heap_activation_mib"], 1),
                         fmt(x["heap_activation_mib"] * x["ranks"] / base[x["N"]]["heap_activation_mib"], 2) if x["N"] in base else "-",
                         fmt(x["step_s"], 2),
                         fmt(base[x["N"]]["step_s"] / (x["ranks"] * x["step_s"]), 2) if x["N"] in base else "-"]
                        for x in sorted(model, key=lambda x: (x["N"], x["ranks"]))]))
        L.append("")
        L.append("Commands:")
        L.append(cmds("model"))
    else:
        L.append("**Not measured in this run**: bench/model (the model benchmark of issue 5) was not on this "
                 "branch when the report was generated. `bench/run` runs it as the `model` suite as soon as "
                 "bench/model/CMakeLists.txt exists (hook marked `MODEL BENCHMARK HOOK` in bench/run).")
    L.append("")

    # Checkpoint.
    L.append("## 6. Checkpoint save/load against the raw disk")
    L.append("")
    L.append("Save (hash, write, fsync, atomic commit) and load (verify on, page cache dropped with "
             "posix_fadvise) of the given state, GB/s = tensor bytes / wall seconds (barrier to barrier). "
             "**Baseline**, same run, same directory: raw write + fsync of one plain file (the faster of "
             "appending and pre-sized), raw read after dropping its cached pages. Per-repetition ratios pair "
             "repetition i's save with its raw write; median and range. The disk is a shared virtual disk: "
             "its raw bandwidth varies several-fold between repetitions.")
    L.append("")
    L.append(fig("io", "checkpoint ratios and MPI ping-pong"))
    L.append("")
    L.append(table(["ranks", "GiB", "raw write GB/s (plain; pre-sized)", "raw read GB/s", "save GB/s", "load GB/s",
                    "save / raw", "range", "load / raw", "range"],
                   [[c["ranks"], fmt(c["bytes"] / 2**30, 2), f"{c['raw_write_GBps']:.2f}; {c['raw_write_presized_GBps']:.2f}",
                     fmt(c["raw_read_GBps"], 2), fmt(c["save_GBps"], 2), fmt(c["load_GBps"], 2), f"**{c['save_ratio']:.2f}**",
                     f"{min(c['save_ratio_reps']):.2f}..{max(c['save_ratio_reps']):.2f}", f"**{c['load_ratio']:.2f}**",
                     f"{min(c['load_ratio_reps']):.2f}..{max(c['load_ratio_reps']):.2f}"] for c in ckpt]))
    L.append("")
    L.append("Commands:")
    L.append(cmds("checkpoint"))
    L.append("")
    if pp:
        L.append(f"MPI ping-pong between 2 ranks (context for the communication figures, not judged): latency "
                 f"{pp['alpha_s'] * 1e6:.2f} us, bandwidth {pp['bandwidth_Bps'] / 1e9:.2f} GB/s at 32 MiB (shared memory).")
        L.append(cmds("pingpong"))
        L.append("")

    # Quick baseline.
    L.append("## 7. Regression baseline (`bench/run --quick`)")
    L.append("")
    L.append("The quick set ran inside this full run; its ratios, with every repetition, are stored in "
             "[results/ratios.json](results/ratios.json). `bench/run --quick` measures the same set again and "
             "flags a ratio that got worse by more than the spread (max - min) of its own repetitions plus the spread stored here.")
    L.append("")
    L.append(table(["metric", "better", "median", "spread (max-min)", "reps", "what"],
                   [[k, v["better"], fmt(v["median"]), fmt(v["spread"]), len(v["reps"]), v["what"]] for k, v in sorted(qm.items())]))
    L.append("")
    L.append("Commands:")
    L.append(cmds("quick"))
    L.append("")
    with open(report_path, "w") as f:
        f.write("\n".join(L) + "\n")
    print(f"wrote {report_path}, {len(made)} plots in {os.path.join(results, 'plots')}")
    return 0


def quick(results, baseline, label=None):
    now = quick_metrics(os.path.join(results, "quick"))
    mach = read_kv(os.path.join(results, "machine.txt"))
    with open(os.path.join(results, "ratios.json"), "w") as f:
        json.dump({"generated": mach.get("date"), "machine": {k: mach.get(k) for k in ("cpu_model", "nproc", "git_commit")},
                   "command": mach.get("command", "bench/run --quick"), "metrics": now}, f, indent=1)
    if not baseline:
        print(table(["metric", "better", "median", "spread (max-min)", "what"],
                    [[k, v["better"], fmt(v["median"]), fmt(v["spread"]), v["what"]] for k, v in sorted(now.items())]))
        print("\nno baseline to compare with (exit 2): nothing judged; this run's ratios are in",
              os.path.join(results, "ratios.json"))
        return 2
    bj = read_json(baseline)
    base = bj["metrics"]
    rows = compare(base, now)
    suites = read_tsv(os.path.join(results, "suites.tsv"))
    lines = ["# Quick regression check", "",
             f"Baseline: {label or baseline} (generated {bj.get('generated', '?')}). Only ratios are compared, "
             "each against a baseline measured in its own run (never absolute times). A metric is flagged DROP "
             "when its median got worse than the baseline's median by more than the spread (max - min) of this "
             "run's repetitions plus the baseline run's (repetitions within one run are correlated, so one "
             f"run's spread understates how far a second run of the same code moves). Wall-time metrics whose ranks were on a CPU less than {ONCPU_JUDGED:.0%} of "
             "the time are listed but not judged (their CPU-time twins are).", ""]
    bm = bj.get("machine") or {}
    if bm.get("cpu_model") and (bm.get("cpu_model") != mach.get("cpu_model") or str(bm.get("nproc")) != mach.get("nproc")):
        lines.append(f"**Warning: the baseline was measured on another machine** ({bm.get('cpu_model')}, "
                     f"{bm.get('nproc')} cores; now {mach.get('cpu_model')}, {mach.get('nproc')} cores): ratios "
                     "such as kernel / sgemm depend on the CPU, so a flag may be the machine, not the code.")
        lines.append("")
    if suites:
        lines.append(f"Load average before/after: {suites[0][3]} / {suites[0][4]}; "
                     f"{float(suites[0][2]) - float(suites[0][1]):.0f} s.")
        nproc = int(read_kv(os.path.join(results, "machine.txt")).get("nproc", "2"))
        # The load after includes this run's own ranks; the load before is other people's work.
        before = float(suites[0][3].split()[0])
        if before > nproc - 0.5:
            lines.append(f"**Warning: the machine was busy (1-min load {before:.1f} on {nproc} cores before the run)**: other work "
                         "competed with the measurements, so a flag may be noise. Rerun when `uptime` is calm.")
        lines.append("")
    lines.append(table(["metric", "baseline", "now", "spreads (now + baseline)", "worse by", "verdict"],
                       [[n, fmt(b), fmt(c), fmt(s), fmt(w), v] for n, b, c, s, w, v in rows]))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results, "quick.md"), "w") as f:
        f.write(text)
    print(text)
    drops = [r for r in rows if r[5] == "DROP"]
    if drops:
        print(f"{len(drops)} drop(s) flagged (exit 3):")
        for n, b, c, sp_, w, _ in drops:
            exact = " (an exact count, not noise)" if len(now[n]["reps"]) == 1 and not sp_ else ""
            print(f"  {n}: {fmt(b)} -> {fmt(c)}, worse by {fmt(w)} > spreads {fmt(sp_)} of this run's "
                  f"{len(now[n]['reps'])} repetition(s) and the baseline's{exact} ({now[n]['what']})")
        print("A flag means: the change from the baseline is larger than the spreads of both runs' repetitions. Rerun on a "
              "calm machine (uptime); a flag that repeats is a regression to look at.")
    else:
        print("no drop flagged (exit 0)")
    return 3 if drops else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["full", "quick"])
    ap.add_argument("--results", required=True)
    ap.add_argument("--report", default="bench/REPORT.md")
    ap.add_argument("--baseline")
    ap.add_argument("--baseline-label")
    a = ap.parse_args()
    if a.mode == "full":
        return full(a.results, a.report)
    return quick(a.results, a.baseline, a.baseline_label)


if __name__ == "__main__":
    sys.exit(main())
