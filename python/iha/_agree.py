"""Agreement before exchange (docs/python.md, "Agreement and time limit").

Every call of a parallel core that exchanges data (building the core, forward, backward, the
gradient sum, a new token map) first runs one agreement over the communicator: each rank sends
every other rank a small record (the call's sequence number and kind, everything that must
match across ranks, and the local checks' verdict) and waits for theirs, point to point on a
private duplicate of the communicator, with a deadline. Every rank then reads the same records
and reaches the same verdict: go on, or raise the same exception (the lowest failing rank's
check, or the first argument the ranks disagree on, with each rank's value). A second round
(a 1-byte "ready" from every rank) makes sure no rank starts the exchange while another has
given up. A rank that never arrives (it raised or exited before the call) makes the others raise
TimeoutError after `timeout` seconds (default 300, IHA_AGREE_TIMEOUT in the environment); after
a time-out the communicator's agreements are out of step, and every later call on it raises at
once (the ranks' state is no longer known: start again).
"""
import hashlib
import json
import os
import time

DEFAULT_TIMEOUT = 300.0
_RECORD_BYTES = 8192      # the largest record (eager-sized: sends complete without the receiver)
_TAG_BASE = 0x1A0         # the private communicator carries only these messages


def default_timeout():
    v = os.environ.get("IHA_AGREE_TIMEOUT")
    if v is None:
        return DEFAULT_TIMEOUT
    try:
        t = float(v)
    except ValueError:
        raise ValueError(f"IHA_AGREE_TIMEOUT: expected seconds (a number > 0), got {v!r}") from None
    if not t > 0:
        raise ValueError(f"IHA_AGREE_TIMEOUT: expected seconds (a number > 0), got {v!r}")
    return t


def check_timeout(timeout):
    if timeout is None:
        return default_timeout()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"argument 'timeout': expected seconds (a number > 0), got {timeout!r}")
    return float(timeout)


def digest(value):
    """A short stable digest of a JSON-able value (segments, token maps): equal on every rank
    exactly when the values are equal."""
    return hashlib.blake2b(json.dumps(value, separators=(",", ":"), default=repr).encode(),
                           digest_size=12).hexdigest()


def _short(v):
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


class _CommState:
    """Per user communicator: the private duplicate, the sequence number, and whether an
    agreement timed out (then every later one raises at once)."""

    def __init__(self, comm):
        self.comm = comm
        self.private = None
        self.seq = 0
        self.dead = None
        self.leftover = []   # requests (and their buffers) abandoned at a time-out

    def _poll(self, reqs, deadline, what, timeout):
        from mpi4py import MPI
        spins = 0
        while True:
            if MPI.Request.Testall(reqs):
                return
            if time.monotonic() > deadline:
                break
            spins += 1
            if spins > 200:
                time.sleep(min(1e-3, 1e-5 * (spins - 200)))
        self.dead = (f"an agreement of the parallel IHA core ({what}) timed out after {timeout:g} s: not every rank "
                     "of the communicator reached it (a rank raised, exited or is stuck before the call)")
        for r in reqs:
            try:
                if not r.Test():
                    r.Cancel()
            except Exception:  # noqa: BLE001 - best effort; the communicator is given up anyway
                pass
        self.leftover.append(reqs)
        raise TimeoutError(self.dead + "; every later call on this communicator raises (start again)")

    def _ensure_private(self, deadline, timeout):
        if self.private is not None:
            return
        from mpi4py import MPI
        out = self.comm.Idup()
        if isinstance(out, tuple):
            new, req = out
        else:  # a newer mpi4py returns the request only and sets the new communicator on it
            req = out
            new = getattr(out, "comm", None)
        self._poll([req], deadline, "duplicating the communicator", timeout)
        self.private = new if new is not None else MPI.COMM_NULL

    def agree(self, call, fields, error, timeout):
        """fields: [(argument, what, value)] with JSON-able values; error: the local checks'
        exception or None. Returns when every rank agrees and none failed; raises otherwise,
        the same exception type and message on every rank."""
        if self.dead is not None:
            raise RuntimeError(self.dead + "; this call was refused (start again)")
        R = self.comm.Get_size()
        seq = self.seq
        self.seq += 1
        if R == 1:
            if error is not None:
                raise error
            return
        from mpi4py import MPI
        deadline = time.monotonic() + timeout
        self._ensure_private(deadline, timeout)
        me = self.comm.Get_rank()
        rec = {"seq": seq, "call": call, "fields": [[a, w, v] for a, w, v in fields],
               "error": None if error is None else [type(error).__name__, str(error)]}
        # Values that are not JSON (a wrong argument's own type) travel as their repr: any value
        # a rank holds can be sent, so no rank fails before the exchange.
        data = json.dumps(rec, separators=(",", ":"), default=repr).encode()
        if len(data) > _RECORD_BYTES:
            # Only a pathological message gets here: keep the verdict, cut the text.
            rec["error"] = None if error is None else [type(error).__name__, str(error)[:2000]]
            rec["fields"] = [[a, w, digest(v)] for a, w, v in fields]
            data = json.dumps(rec, separators=(",", ":"), default=repr).encode()[:_RECORD_BYTES]
        tag = _TAG_BASE + (seq % 8000) * 2
        priv = self.private
        bufs = [bytearray(_RECORD_BYTES) for _ in range(R)]
        reqs = []
        for r in range(R):
            if r != me:
                reqs.append(priv.Irecv([bufs[r], MPI.BYTE], source=r, tag=tag))
        for r in range(R):
            if r != me:
                reqs.append(priv.Isend([data, MPI.BYTE], dest=r, tag=tag))
        self._poll(reqs, deadline, f"call {seq}, {call}", timeout)
        records = []
        for r in range(R):
            if r == me:
                records.append(rec)
                continue
            try:  # JSON has no NUL byte: the record ends where the zero padding starts
                records.append(json.loads(bytes(bufs[r]).rstrip(b"\0").decode()))
            except ValueError:
                records.append({"seq": None, "call": "an unreadable record", "fields": [], "error": None})
        verdict = _verdict(records, R)
        if verdict is not None:
            exc_type, msg = verdict
            raise exc_type(msg) from error
        # Second round: every rank has the verdict "go on" before any starts exchanging.
        ready = bytearray(1)
        rbufs = [bytearray(1) for _ in range(R)]
        reqs = [priv.Irecv([rbufs[r], MPI.BYTE], source=r, tag=tag + 1) for r in range(R) if r != me]
        reqs += [priv.Isend([ready, MPI.BYTE], dest=r, tag=tag + 1) for r in range(R) if r != me]
        self._poll(reqs, deadline, f"call {seq}, {call}, second round", timeout)


_EXC = {"TypeError": TypeError, "ValueError": ValueError, "MemoryError": MemoryError, "IndexError": IndexError,
        "KeyError": KeyError, "OverflowError": OverflowError}


def _verdict(records, R):
    """(exception type, message) or None: the same on every rank (a function of the records)."""
    seqs = [(r, rec.get("seq"), rec.get("call")) for r, rec in enumerate(records)]
    if len({(s, c) for _, s, c in seqs}) > 1:
        listing = ", ".join(f"rank {r} at call {s} ({c})" for r, s, c in seqs)
        return RuntimeError, ("ranks are out of step: every rank must make the same calls of the parallel IHA core "
                              f"in the same order; {listing}")
    for r, rec in enumerate(records):
        if rec.get("error"):
            name, msg = rec["error"]
            return _EXC.get(name, RuntimeError), f"rank {r}: {msg}" + ("" if name in _EXC else f" ({name})")
    names = [tuple((f[0], f[1]) for f in rec["fields"]) for rec in records]
    if len(set(names)) > 1:
        return RuntimeError, "ranks are out of step: their calls check different arguments"
    for i, (arg, what) in enumerate(names[0]):
        vals = [rec["fields"][i][2] for rec in records]
        if any(v != vals[0] for v in vals[1:]):
            shown = ", ".join(f"rank {r} has {_short(v)}" for r, v in enumerate(vals))
            return ValueError, f"argument '{arg}': ranks disagree on {what}: {shown}"
    return None


_STATES = {}


def state_for(comm):
    """The agreement state of an mpi4py communicator (one per communicator handle)."""
    from mpi4py import MPI
    key = MPI._handleof(comm)
    st = _STATES.get(key)
    if st is None:
        st = _STATES[key] = _CommState(comm)
    return st
