"""Mutation fuzzer over a real kdtrain checkpoint (validation/faults/test_fuzz.sh).

usage: ckpt_fuzz.py KDTRAIN BASE.nml CHECKPOINT.h5 MAX_CASES

Every attribute and every dataset of the checkpoint gets mutated: its type changed, its
rank changed, its shape or (string) size changed, deleted, renamed, swapped with another of
equal shape; the file is also truncated at several points. Each mutant is loaded with
`kdtrain BASE.nml checkpoint%resume=MUTANT` (run%steps = the checkpoint's step: load, no
step, write final.h5). Allowed outcomes: exit 2 (refused) or exit 0 with /params of final.h5
bitwise equal to the original's (an exact load); anything else (a crash, a sanitizer report,
a silent wrong load) fails. Every object gets at least one mutation and every kind is used;
beyond that, cases are sampled (fixed seed) to MAX_CASES.

Then the strict cases (format 1.2: every attribute and dataset kdtrain writes is inside a
checksum): the value of every attribute outside /params and /optim, of the attributes of
two tensors and of every scalar dataset is changed with its type and shape kept (an
integer's lowest bit, a real's lowest mantissa bit, a string's last character), the
run's namelist gets one character changed and is replaced by a 300 x 300 uint8 array.
Each of these must be exit 2 with a message naming the object or the attribute.
Prints the counts."""
import os
import random
import shutil
import subprocess
import sys

import h5py
import numpy as np

kdtrain, base, ckpt, max_cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(14)

objs = []  # (kind, path, attr name or None)
with h5py.File(ckpt, "r") as f:
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            objs.append(("dset", "/" + name, None))
        for a in obj.attrs:
            objs.append(("attr", "/" + name, a))
    for a in f.attrs:
        objs.append(("attr", "/", a))
    f.visititems(visit)
    ref = {k: np.array(v) for k, v in f["params"].items()} if "params" in f else {}
    shapes = {}
    def shp(name, obj):
        if isinstance(obj, h5py.Dataset):
            shapes.setdefault(obj.shape, []).append("/" + name)
    f.visititems(shp)

KINDS = ["type", "rank", "shape", "delete", "rename", "swap"]


def mutate_attr(f, path, name, kind):
    obj = f[path]
    v = obj.attrs[name]
    if kind == "type":
        if isinstance(v, (bytes, str)) or (hasattr(v, "dtype") and v.dtype.kind in "SOU"):
            obj.attrs[name] = np.int64(7)
        elif hasattr(v, "dtype") and v.dtype.kind == "f":
            obj.attrs[name] = np.bytes_(b"1.0e4")
        else:
            obj.attrs[name] = np.float32(0.5)
    elif kind == "rank":
        obj.attrs[name] = np.array([v, v, v, v] if np.ndim(v) == 0 else [v])
    elif kind == "shape":  # size: a long string, or an array of 64 elements
        if isinstance(v, (bytes, str)) or (hasattr(v, "dtype") and v.dtype.kind in "SOU"):
            obj.attrs[name] = np.bytes_(b"x" * 60000)
        else:
            obj.attrs[name] = np.zeros((8, 8), dtype=np.asarray(v).dtype)
    elif kind == "delete":
        del obj.attrs[name]
    elif kind == "rename":
        obj.attrs[name + "_renamed"] = v
        del obj.attrs[name]
    elif kind == "swap":
        others = [a for a in obj.attrs if a != name]
        if not others:
            return False
        o = rng.choice(others)
        a, b = obj.attrs[name], obj.attrs[o]
        obj.attrs[name], obj.attrs[o] = b, a
    return True


def mutate_dset(f, path, kind):
    d = f[path]
    parent, leaf = path.rsplit("/", 1)
    parent = parent or "/"
    attrs = dict(d.attrs)
    data = d[()]

    def replace(newdata, dtype=None):
        del f[path]
        nd = f[parent].create_dataset(leaf, data=newdata, dtype=dtype)
        for k, v in attrs.items():
            nd.attrs[k] = v

    if kind == "type":
        if np.asarray(data).dtype == np.float64:
            replace(np.asarray(data).astype(np.float32))
        elif np.asarray(data).dtype.kind == "f":
            replace(np.asarray(data).astype(np.float64))
        elif np.asarray(data).dtype.kind in "iu":
            replace(np.asarray(data).astype(np.float32))
        else:
            replace(np.int64(3))
    elif kind == "rank":
        a = np.asarray(data)
        replace(a.reshape(-1) if a.ndim >= 2 else a.reshape(1, -1) if a.ndim == 1 else a.reshape(1))
    elif kind == "shape":
        a = np.asarray(data)
        if a.ndim == 0 or a.dtype.kind in "SOU":
            replace(np.zeros(3, dtype=np.float32))
        else:
            replace(np.concatenate([a.reshape(-1), a.reshape(-1)[:1]]))
    elif kind == "delete":
        del f[path]
    elif kind == "rename":
        f.move(path, path + "_renamed")
    elif kind == "swap":
        same = [p for p in shapes.get(d.shape, []) if p != path]
        if not same:
            return False
        o = rng.choice(same)
        f.move(path, path + "__tmp")
        f.move(o, path)
        f.move(path + "__tmp", o)
    return True


# every object outside /params and /optim first, then the tensors' datasets and attributes
# shuffled; kinds round-robin over objects; MAX_CASES bounds the total (CI time)
meta = [o for o in objs if not o[1].startswith(("/params", "/optim"))]
tens = [o for o in objs if o[1].startswith(("/params", "/optim"))]
rng.shuffle(tens)
order = meta + tens
cases = [(k, p, a, KINDS[i % len(KINDS)]) for i, (k, p, a) in enumerate(order)][:max_cases]
covered = len(cases)
size = os.path.getsize(ckpt)
for frac in (0.02, 0.3, 0.6, 0.95, 0.999):
    cases.append(("trunc", str(int(size * frac)), None, "truncate"))

counts = {"refused": 0, "exact": 0}
bad, exact = [], []
for n, (k, p, a, m) in enumerate(cases):
    mut = "mutant.h5"
    shutil.copy(ckpt, mut)
    if k == "trunc":
        os.truncate(mut, int(p))
        ok = True
    else:
        with h5py.File(mut, "r+") as f:
            ok = mutate_attr(f, p, a, m) if k == "attr" else mutate_dset(f, p, m)
    if not ok:
        continue
    shutil.rmtree("fz", ignore_errors=True)
    r = subprocess.run([kdtrain, base, "run%out_dir='fz'", "checkpoint%resume='mutant.h5'"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    what = f"{m} {k} {p}{' @' + a if a else ''}"
    out = r.stdout.decode(errors="replace")
    if r.returncode == 2 and "Sanitizer" not in out and "runtime error" not in out:
        counts["refused"] += 1
    elif r.returncode == 0 and "Sanitizer" not in out and "runtime error" not in out:
        with h5py.File("fz/final.h5", "r") as g:
            same = set(g["params"]) == set(ref) and all(
                np.array_equal(np.array(g["params"][x]), ref[x]) for x in ref)
        if same:
            counts["exact"] += 1
            exact.append(what)
        else:
            bad.append(f"{what}: exit 0 but the loaded weights differ from the original")
    else:
        bad.append(f"{what}: exit {r.returncode}\n" + out[-1500:])
    counts.setdefault(m, 0)
    counts[m] += 1



def changed(v):
    """v with its type and shape kept and one bit of its value changed."""
    a = np.array(v)
    if a.dtype.kind in "SO" or isinstance(v, (bytes, str)):
        b = v.encode() if isinstance(v, str) else bytes(v)
        b = b[:-1] + bytes([b[-1] ^ 1])
        return b.decode() if isinstance(v, str) else np.bytes_(b)
    if a.dtype.kind in "iub":
        return (a ^ 1).astype(a.dtype)
    bits = a.view(np.uint64 if a.dtype.itemsize == 8 else np.uint32)
    return (bits ^ 1).view(a.dtype)


def change_attr(f, path, name):
    f[path].attrs.modify(name, changed(f[path].attrs[name]))


def change_dset(f, path):
    d = f[path]
    if d.dtype.kind == "S":  # a fixed-length string: its bytes, one changed
        raw = bytearray(d[()])
        raw[len(raw) // 2] ^= 1
        d[()] = bytes(raw)
    else:
        d[()] = changed(d[()])


def namelist_array(f, path):
    del f[path]
    f.create_dataset(path, data=np.zeros((300, 300), dtype=np.uint8))


strict = [("value", "attr", p, a) for (k, p, a) in meta if k == "attr"]
strict += [("value", "attr", p, a) for (k, p, a) in objs
           if k == "attr" and p in sorted({q for (_, q, _) in tens})[:2]]
with h5py.File(ckpt, "r") as f:
    strict += [("value", "dset", p, None) for (k, p, a) in meta
               if k == "dset" and (f[p].shape == () or f[p].dtype.kind == "S")]
    if "config/namelist" in f:
        strict.append(("array", "dset", "/config/namelist", None))
for m, k, p, a in strict:
    shutil.copy(ckpt, "mutant.h5")
    with h5py.File("mutant.h5", "r+") as f:
        if m == "array":
            namelist_array(f, p)
        elif k == "attr":
            change_attr(f, p, a)
        else:
            change_dset(f, p)
    shutil.rmtree("fz", ignore_errors=True)
    r = subprocess.run([kdtrain, base, "run%out_dir='fz'", "checkpoint%resume='mutant.h5'"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = r.stdout.decode(errors="replace")
    what = f"{m} {k} {p}{' @' + a if a else ''}"
    names = [x for x in p.split("/") if x] + ([a] if a else []) + (["root"] if p == "/" else [])
    if r.returncode != 2 or "Sanitizer" in out or "runtime error" in out:
        bad.append(f"{what}: exit {r.returncode}, expected 2\n" + out[-1500:])
    elif not any(x in out for x in names):
        bad.append(f"{what}: refused, but the message names none of {names}:\n" + out[-800:])
    else:
        counts.setdefault(m, 0)
        counts[m] += 1

total = sum(counts[m] for m in KINDS + ["truncate"] if m in counts)
print(f"ckpt_fuzz: {total} cases over {covered} of the {len(objs)} objects (all outside /params "
      f"and /optim, the tensors sampled): {counts['refused']} refused "
      f"(exit 2), {counts['exact']} exact loads, {len(bad)} failures; per kind: "
      + ", ".join(f"{m} {counts.get(m, 0)}" for m in KINDS + ["truncate"]))
print(f"ckpt_fuzz: {len(strict)} strict cases (a value changed in place, the namelist replaced "
      f"by an array): {counts.get('value', 0) + counts.get('array', 0)} refused naming the object")
for e in exact:
    print("exact load:", e)
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
