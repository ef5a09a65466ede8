"""The statistics of docs/experiments.md section 5 (64k for real), apart from the runs so that the
CTest smoke test can check them on hand-made score files.

A score file (`iha-train score --out`) holds loss[s, n]: the cross-entropy of token n + 1 of
sequence s given tokens 0..n, NaN where position n has no target. "Token t" below is the t-th token
of a document (t >= 1), scored at loss[s, t - 1].
"""
import math
import os

import numpy as np

import expkit


def read_scores(path):
    import h5py
    with h5py.File(path, "r") as f:
        return np.array(f["loss"][:], dtype=np.float64), np.array(f["hit"][:], dtype=np.uint8)


def write_scores(path, loss, hit):
    """(loss, hit) as a file read_scores reads (the slices of a score joined)."""
    import h5py
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("loss", data=loss)
        f.create_dataset("hit", data=hit)
    os.replace(tmp, path)


def token_losses_full(loss, L):
    """[docs, L]: the loss of token t of each held-out document at column t (column 0 NaN)."""
    out = np.full((loss.shape[0], L), np.nan)
    out[:, 1:] = loss[:, :L - 1]
    return out


def token_losses_truncated(win_loss, docs, L, n0):
    """[docs, L]: the truncated-context loss of token t, from the windows of 2 n0 tokens at stride n0
    (window j of a document starts at token j n0, j = 1 .. L / n0 - 2; the file holds each
    document's windows in order). Token t >= 2 n0 is scored in window j = t // n0 - 1 at window
    position w = t - j n0 in [n0, 2 n0), so with w tokens (n0 .. 2 n0 - 1) of context. Columns
    below 2 n0 are NaN."""
    per_doc = L // n0 - 2
    if win_loss.shape[0] != docs * per_doc or win_loss.shape[1] != 2 * n0:
        raise ValueError("truncated scores: %s, expected [%d, %d]" % (win_loss.shape, docs * per_doc, 2 * n0))
    out = np.full((docs, L), np.nan)
    for d in range(docs):
        for j in range(1, per_doc + 1):
            w = win_loss[d * per_doc + j - 1]
            # tokens (j + 1) n0 .. (j + 2) n0 - 1 are window positions n0 .. 2 n0 - 1: loss index w - 1
            out[d, (j + 1) * n0:(j + 2) * n0] = w[n0 - 1:2 * n0 - 1]
    return out


def log_bins(L, first=1):
    """[lo, hi) token ranges: [1, 2), [2, 4), ..., [L / 2, L)."""
    bins, lo = [], first
    while lo < L:
        hi = min(2 * lo, L)
        bins.append((lo, hi))
        lo = hi
    return bins


def mean_interval(values):
    """Mean, standard error and 95% interval (Student's t, n - 1 degrees of freedom) of a list."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    m = float(v.mean())
    if n < 2:
        return {"mean": m, "se": None, "lo": None, "hi": None, "n": n}
    se = float(v.std(ddof=1) / math.sqrt(n))
    t = expkit.t975(n - 1)
    return {"mean": m, "se": se, "lo": m - t * se, "hi": m + t * se, "n": n}


def verdict(iv):
    """The declared rule: 'uses the long context' where the whole interval of full - truncated is
    below 0, 'hurt by the long context' where it is above 0, else 'not established'."""
    if iv["lo"] is None:
        return "no interval"
    if iv["hi"] < 0:
        return "uses the long context"
    if iv["lo"] > 0:
        return "hurt by the long context"
    return "not established"


def context_gain(full, trunc, lo, hi):
    """Per document: mean over tokens [lo, hi) of full - truncated loss (nats per byte)."""
    d = full[:, lo:hi] - trunc[:, lo:hi]
    if np.isnan(d).any():
        raise ValueError("a token in [%d, %d) has no full or truncated score" % (lo, hi))
    return d.mean(axis=1)


def passkey_success(loss, hit, rows, digits=5):
    """Per probe: whether every answer digit is the arg-max (teacher-forced: the greedy answer
    equals the key), and the answer's summed loss. rows: the corpus's passkey-L.json."""
    out = []
    for r in rows:
        s, a = r["sequence"], r["answer_at"]
        idx = np.arange(a - 1, a - 1 + digits)  # digit t = a + k is scored at loss index t - 1
        h = hit[s, idx]
        ls = loss[s, idx]
        if np.isnan(ls).any():
            raise ValueError("pass-key probe %d: an answer digit has no score" % s)
        out.append({"depth": r["depth"], "ok": bool(h.all()), "loss": float(ls.sum())})
    return out
