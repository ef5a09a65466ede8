"""The tables and plots of docs/experiments.md section 5 (64k for real), made from
docs/experiments/ctx64k_results.json only. regen_doc.py writes the tables between their
`<!-- regen:ctx64k-... -->` markers and checks them (CTest experiment_doc_tables); a part
whose runs have not finished says so instead of a number.
"""
import numpy as np

import ctx64k_stats as st

MODELS = [("base", "base, no scaling"), ("base-yarn", "base, yarn, no fine-tune"),
          ("ft-yarn-s1", "fine-tuned, yarn, seed 1"), ("ft-yarn-s2", "fine-tuned, yarn, seed 2"),
          ("ft-none-s1", "fine-tuned, none, seed 1"), ("ft-none-s2", "fine-tuned, none, seed 2")]
ARMS = [("yarn", "fine-tuned, yarn (seeds 1, 2)"), ("none", "fine-tuned, none (seeds 1, 2)")]


def _table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _iv(iv):
    if iv["lo"] is None:
        return "%+.4f (n = %d, no interval)" % (iv["mean"], iv["n"])
    return "%+.4f [%+.4f, %+.4f]" % (iv["mean"], iv["lo"], iv["hi"])


def progress(d):
    """Every stage: steps reached (training), invocations, seconds, first start and last end."""
    stages = d.get("stages", {})
    if not stages:
        return "*No stage has run yet.*"
    rows = []
    for name in sorted(stages, key=lambda n: min(i["start"] for i in stages[n]["invocations"])):
        inv = stages[name]["invocations"]
        secs = sum(i.get("seconds", 0) or 0 for i in inv)
        rows.append([name, stages[name].get("steps", "-"), len(inv), "%.0f" % secs, inv[0]["start"], inv[-1]["end"]])
    return _table(["stage", "steps reached", "invocations", "seconds", "first start", "last end"], rows)


def gate(d):
    """Per gate evaluation: probes solved, and the answer's mean loss per digit against a guess
    uniform over the ten digits (ln 10 = 2.30 nats): a model with no skill sits near or above it."""
    rows = [[k, v["step"], "%d / %d" % (sum(p["ok"] for p in v["probes"]), len(v["probes"])), "%.3f" % v["accuracy"],
             "%.2f" % (float(np.mean([p["loss"] for p in v["probes"]])) / 5)]
            for k, v in sorted(d.get("scores", {}).items()) if k.startswith("base-gate")]
    if not rows:
        return "*The gate has not been evaluated yet.*"
    return _table(["evaluation", "base step", "probes solved at N0", "accuracy (gate 0.80)",
                   "answer loss per digit (nats; uniform guess 2.30)"], rows)


def _gain(d, model):
    s = d.get("scores", {}).get(model, {})
    return s["full"]["gain_per_doc"] if "full" in s else None


def endpoint(d):
    """The primary endpoint per model and per arm (the per-document mean of its seeds)."""
    rows = []
    for model, label in MODELS:
        g = _gain(d, model)
        if g is None:
            rows.append([label, "not run yet", "-"])
            continue
        iv = st.mean_interval(g)
        rows.append([label, _iv(iv), st.verdict(iv)])
    for arm, label in ARMS:
        gs = [_gain(d, "ft-%s-s%d" % (arm, s)) for s in (1, 2)]
        if any(g is None for g in gs):
            rows.append([label, "not run yet (needs both seeds)", "-"])
            continue
        iv = st.mean_interval(np.mean(gs, axis=0))
        rows.append([label, _iv(iv), st.verdict(iv)])
    return _table(["model", "full - truncated loss, tokens 8,192-65,535 (nats/byte), mean [95% interval]",
                   "verdict (declared rule)"], rows)


def bins(d):
    """Full-context and truncated-context loss by bin from 8,192, mean over the documents."""
    rows = []
    for model, label in MODELS:
        s = d.get("scores", {}).get(model, {})
        if "full" not in s:
            continue
        f = s["full"]
        full = np.array(f["full_bin_loss_same_tokens"])
        tr = np.array(f["trunc_bin_loss"])
        for k, (lo, hi) in enumerate(f["trunc_bins"]):
            iv = st.mean_interval(full[:, k] - tr[:, k])
            rows.append([label, "%d-%d" % (lo, hi - 1), "%.4f" % full[:, k].mean(), "%.4f" % tr[:, k].mean(), _iv(iv)])
    if not rows:
        return "*No model has been scored yet.*"
    return _table(["model", "tokens", "full context", "truncated (4,096-8,191 tokens)", "difference [95% interval]"],
                  rows)


def passkey(d):
    """Pass-key probes solved by length (all depths), per model."""
    lengths = d.get("design", {}).get("passkey_lengths", [4096, 16384, 32768, 65536])
    rows = []
    for model, label in MODELS:
        s = d.get("scores", {}).get(model, {})
        cells = []
        for L in lengths:
            p = s.get("passkey-%d" % L)
            cells.append("%d / %d" % (sum(x["ok"] for x in p), len(p)) if p else "-")
        if any(c != "-" for c in cells):
            rows.append([label] + cells)
    if not rows:
        return "*No pass-key probe has been scored yet.*"
    return _table(["model"] + ["%d" % L for L in lengths], rows)


def stretch(d):
    """The stretch at 131,072 tokens (twice the fine-tuned length) for the fine-tunes."""
    rows = []
    for model, label in MODELS:
        s = d.get("scores", {}).get(model, {})
        if "stretch" not in s:
            continue
        iv = st.mean_interval(s["stretch"]["gain_per_doc"])
        p = s.get("passkey-131072")
        rows.append([label, _iv(iv), st.verdict(iv), "%d / %d" % (sum(x["ok"] for x in p), len(p)) if p else "-"])
    if not rows:
        return "*The stretch has not run yet.*"
    return _table(["model", "full - truncated, tokens 8,192-131,071 (8 documents) [95% interval]", "verdict",
                   "pass keys solved at 131,072"], rows)


def mechanics(d):
    m = d.get("mechanics")
    if not m or not m.get("done"):
        return "*The mechanics checks have not run yet.*"
    rows = []
    for key, ranks in (("ranks_4", 4), ("ranks_2", 2)):
        f = m.get(key)
        if f:
            rows.append(["%d ranks" % ranks, "%.1f" % f["step_time_s"], "%.0f" % f["tokens_per_s"],
                         "%.3f" % f["utilization"], "%.0f" % f["peak_rss_mib_per_rank"]])
    t = _table(["65,536 tokens", "step time (s, median)", "tokens/s", "model FLOPs / sgemm of all ranks",
                "peak RSS per rank (MiB)"], rows)
    return t + "\n\n" + _table(["check", "result"], [
        ["SIGKILL during a step, then `--resume auto`", "killed mid-run: %s; from step %d, losses bit-identical: %s"
         % (m["killed_mid_run"], m["resumed_from_step"], m["resume_bit_identical"])],
        ["checkpoint resumed on %d ranks (from %d)" % (m["reshard_ranks"][1], m["reshard_ranks"][0]),
         "largest relative loss difference %.2e (within 1e-4: %s)" % (m["reshard_max_rel_loss_diff"] or float("nan"),
                                                                        m["reshard_within_1e-4"])],
        ["checkpoint bytes", "%d" % m["checkpoint_bytes"]]])


TABLES = {"ctx64k-progress": progress, "ctx64k-gate": gate, "ctx64k-endpoint": endpoint, "ctx64k-bins": bins,
          "ctx64k-passkey": passkey, "ctx64k-mechanics": mechanics, "ctx64k-stretch": stretch}


def plots(d, folder):
    """ctx64k_loss.png (loss by position bin, full and truncated) and ctx64k_passkey.png (solved
    fraction by length x depth for each model), for the models the JSON holds."""
    import os
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scored = [(m, label) for m, label in MODELS if "full" in d.get("scores", {}).get(m, {})]
    if scored:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=90)
        for m, label in scored:
            f = d["scores"][m]["full"]
            xs = [np.sqrt(lo * hi) for lo, hi in f["bins"]]
            ax.plot(xs, np.nanmean(np.array(f["bin_loss"], dtype=float), axis=0), marker="o", label=label)
            xt = [np.sqrt(lo * hi) for lo, hi in f["trunc_bins"]]
            ax.plot(xt, np.mean(np.array(f["trunc_bin_loss"]), axis=0), linestyle="--", marker="x",
                    color=ax.lines[-1].get_color(), label=label + ", truncated")
        ax.axvline(d.get("design", {}).get("n0", 4096), color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token position (log2)")
        ax.set_ylabel("held-out loss (nats per byte)")
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, "ctx64k_loss.png"))
        plt.close(fig)
    lengths = d.get("design", {}).get("passkey_lengths", [])
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    have = [(m, label) for m, label in MODELS if any("passkey-%d" % L in d.get("scores", {}).get(m, {})
                                                      for L in lengths)]
    if have:
        fig, axes = plt.subplots(1, len(have), figsize=(2.6 * len(have) + 1, 3), dpi=90, squeeze=False)
        for ax, (m, label) in zip(axes[0], have):
            grid = np.full((len(depths), len(lengths)), np.nan)
            for j, L in enumerate(lengths):
                ps = d["scores"][m].get("passkey-%d" % L)
                if ps:
                    for i, dep in enumerate(depths):
                        cell = [p["ok"] for p in ps if abs(p["depth"] - dep) < 1e-9]
                        grid[i, j] = np.mean(cell) if cell else np.nan
            ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
            ax.set_xticks(range(len(lengths)), ["%dk" % (L // 1024) for L in lengths], fontsize=7)
            ax.set_yticks(range(len(depths)), ["%g" % x for x in depths], fontsize=7)
            ax.set_title(label, fontsize=7)
        axes[0][0].set_ylabel("depth of the statement")
        fig.tight_layout()
        fig.savefig(os.path.join(folder, "ctx64k_passkey.png"))
        plt.close(fig)
