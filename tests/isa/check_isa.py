#!/usr/bin/env python3
"""Portable binaries: no AVX-512 instruction outside the objects compiled for it.

    check_isa.py --objdump OBJDUMP --nm NM --objects OBJ... --linked BIN... [--native]

OBJ are the library's object files: those named *_avx512.cpp.o are the dispatched ones (see
iha_avx512_sources in CMakeLists.txt), every other one is a default object. BIN are the linked
libraries and programs. Checks:
  1. no default object holds an AVX-512 instruction: EVEX-encoded (prefix byte 0x62), or on a
     zmm or mask (k) register;
  2. every dispatched object holds some (else the scan would prove nothing), and defines no
     code the linker could merge with a default object's copy: no weak functions (inline
     functions and templates of shared headers), global symbols only in a namespace named
     avx512, everything else of internal linkage;
  3. in the linked binaries, every function holding an AVX-512 instruction is in such a
     namespace (an inline function merged from a dispatched object would show up here).
With --native (IHA_NATIVE=ON: every object is built for the build machine) only check 2 runs.
Exit 0 if all hold, 1 with the offending functions listed, 77 when there is nothing to check.
"""
import argparse
import re
import subprocess
import sys

LEGACY_PREFIXES = {"26", "2e", "36", "3e", "64", "65", "66", "67", "f0", "f2", "f3"}
AVX512_OPERAND = re.compile(r"%zmm\d|%k[0-7]\b|\{1to\d+\}")
DISPATCH_NAMESPACE = "::avx512::"


def is_avx512(raw_bytes, text):
    """raw_bytes: the instruction's bytes as hex strings; text: its disassembly."""
    i = 0
    while i < len(raw_bytes) and raw_bytes[i] in LEGACY_PREFIXES:
        i += 1
    # In 64-bit mode 0x62 as the first opcode byte is always the EVEX prefix (BOUND is gone).
    if i < len(raw_bytes) and raw_bytes[i] == "62":
        return True
    return AVX512_OPERAND.search(text) is not None


def avx512_functions(objdump, path):
    """{demangled function name: first AVX-512 instruction} for one object or binary."""
    out = subprocess.run([objdump, "-d", "-w", "-C", path], check=True, capture_output=True,
                         text=True).stdout
    found = {}
    func = None
    header = re.compile(r"^[0-9a-f]+ <(.*)>:$")
    for line in out.splitlines():
        m = header.match(line)
        if m:
            func = m.group(1)
            continue
        parts = line.split("\t")
        if len(parts) < 3 or func is None or func in found:
            continue
        raw = parts[1].split()
        text = parts[2]
        if is_avx512(raw, text):
            found[func] = text.strip()
    return found


def merge_risks(nm, path):
    """Symbols of a dispatched object that the linker could merge or that leak its code."""
    out = subprocess.run([nm, "-C", "--defined-only", path], check=True, capture_output=True,
                         text=True).stdout
    bad = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 3:
            continue
        kind, name = parts[1], parts[2]
        # Weak code (W, w) is what inline functions and templates become; weak data (V, v,
        # u: e.g. DW.ref.__gxx_personality_v0, guard variables) holds no instructions.
        if kind in ("W", "w"):
            bad.append("%s (weak: mergeable with another object's copy)" % name)
        elif kind.isupper() and kind != "V" and DISPATCH_NAMESPACE not in name:
            bad.append("%s (global, outside a namespace named avx512)" % name)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objdump", required=True)
    ap.add_argument("--nm", required=True)
    ap.add_argument("--objects", nargs="+", required=True)
    ap.add_argument("--linked", nargs="+", required=True)
    ap.add_argument("--native", action="store_true")
    a = ap.parse_args()
    # CMake before 3.27 cannot expand a generator-expression list into separate arguments.
    a.objects = [p for arg in a.objects for p in arg.split(";") if p]
    a.linked = [p for arg in a.linked for p in arg.split(";") if p]

    dispatched = [o for o in a.objects if o.endswith("_avx512.cpp.o")]
    default = [o for o in a.objects if o not in dispatched]
    if not dispatched or not default:
        print("check_isa: no %s objects given: nothing to check" % ("dispatched" if not dispatched else "default"))
        return 77
    failures = []

    for o in dispatched:
        if not avx512_functions(a.objdump, o):
            failures.append("%s: no AVX-512 instruction found in a dispatched object" % o)
        for s in merge_risks(a.nm, o):
            failures.append("%s: defines %s" % (o, s))

    if a.native:
        print("check_isa: IHA_NATIVE=ON builds every object for this machine; only the dispatched "
              "objects' symbols were checked")
    else:
        for o in default:
            for func, insn in avx512_functions(a.objdump, o).items():
                failures.append("%s: %s: AVX-512 instruction in a default object: %s" % (o, func, insn))
        for b in a.linked:
            for func, insn in avx512_functions(a.objdump, b).items():
                if DISPATCH_NAMESPACE not in func:
                    failures.append("%s: %s: AVX-512 instruction outside the dispatched code: %s"
                                    % (b, func, insn))

    for f in failures:
        print("FAIL " + f)
    print("check_isa: %d default and %d dispatched objects, %d linked binaries: %s"
          % (len(default), len(dispatched), len(a.linked), "FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
