"""Hostile teacher caches (validation/faults/test_cache_fuzz.sh, doc/cache.md "What is tested").

usage: cache_fuzz.py KDTRAIN BASE.nml CACHE.h5

Every root attribute of a real cache made by kdtrain is replaced by a 64-element array, an
over-long string (a string one also by an over-long Python str, h5py's variable-length
UTF-8) and a value of the wrong class, and deleted; some get a value out of
range. Each dataset is deleted, cut to half its windows, flattened and retyped. The
entries get token ids out of range and NaN or infinite log-probabilities and tails, with
the window checksums and the file checksum recomputed as kdtrain computes them (so only
the entry checks can catch them); a damaged window and a wrong file checksum are left for
the checksums. The file is truncated at several points and replaced by bytes that are not
HDF5. The cache with every string attribute rewritten as a Python str must train as the
original. Each mutant is read by `kdtrain BASE.nml teacher%cache='mN/mutant.h5'` (a one-step
distillation from the cache). The only allowed outcome is exit 2 with a message that names
the file and the field, and no sanitizer report: a signal, an I/O status, a hang (60 s), a
silent run all fail. The unmutated cache must first train (exit 0). Prints the counts."""
import concurrent.futures
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

kdtrain, base, cache = sys.argv[1], sys.argv[2], sys.argv[3]
MUT = "mutant.h5"
FNV_BASIS, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv(h, data):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def window_crc(ids, logp, tail):
    """tcache_window_crc: FNV-1a over the window's ids, logp and tail bytes (little-endian)."""
    h = fnv(FNV_BASIS, np.ascontiguousarray(ids, dtype="<i4").tobytes())
    h = fnv(h, np.ascontiguousarray(logp, dtype="<f4").tobytes())
    return fnv(h, np.ascontiguousarray(tail, dtype="<f4").tobytes())


def reseal(f, file_sum=True):
    """Recompute every window checksum of /crc and (file_sum) the file's checksum attribute."""
    ids, logp, tail = f["ids"][()], f["logp"][()], f["tail"][()]
    crc = np.array([window_crc(ids[w], logp[w], tail[w]) for w in range(ids.shape[0])],
                   dtype=np.uint64)
    f["crc"][...] = crc
    if file_sum:
        f.attrs["checksum"] = np.uint64(fnv(FNV_BASIS, crc.astype("<u8").tobytes()))


def is_str(v):
    return isinstance(v, (bytes, str)) or (hasattr(v, "dtype") and v.dtype.kind in "SOU")


def attr_case(name, kind):
    def mutate(f):
        v = f.attrs[name]
        if kind == "array":  # 64 values where one is expected
            f.attrs[name] = (np.array([np.bytes_(v)] * 64) if is_str(v) else np.full(64, v))
        elif kind == "long string":
            f.attrs[name] = np.bytes_(b"x" * 60000)
        elif kind == "long str":  # as h5py writes a Python str: variable-length UTF-8
            f.attrs[name] = "\u00e9" * 30000
        elif kind == "missing":
            del f.attrs[name]
        elif kind == "class":  # the same value in another type class
            if is_str(v):
                f.attrs[name] = np.int64(7)
            elif np.asarray(v).dtype.kind == "f":
                f.attrs[name] = np.bytes_(repr(float(v)).encode())
            else:
                f.attrs[name] = np.float64(v)
    return (f"attribute {name}: {kind}", mutate, [f"'{name}'"])


def value_case(name, value, what):
    def mutate(f):
        f.attrs[name] = value
    return (f"attribute {name}: {what}", mutate, [f"'{name}'"])


def dset_case(name, kind):
    def mutate(f):
        d = f[name][()]
        if kind == "missing":
            del f[name]
            return
        del f[name]
        if kind == "half length":
            f.create_dataset(name, data=d[: d.shape[0] // 2])
        elif kind == "flattened":
            f.create_dataset(name, data=d.reshape(-1) if d.ndim > 1 else d.reshape(1, -1))
        elif kind == "retyped":
            f.create_dataset(name, data=d.astype(np.float64 if d.dtype.kind == "f" or name == "crc"
                                                  else np.float32))
    return (f"dataset /{name}: {kind}", mutate, [f"/{name}"])


def entry_case(what, field, fn, file_sum=True, sealed=True):
    def mutate(f):
        fn(f)
        if sealed:
            reseal(f, file_sum)
    return (f"entries: {what}", mutate, field)


def set_entries(name, index, value):
    def fn(f):
        a = f[name][()]
        a[index] = value
        f[name][...] = a
    return fn


with h5py.File(cache, "r") as f:
    attrs = sorted(f.attrs)
    f0_attrs = {a: f.attrs[a] for a in attrs}
    vocab, k, nw = int(f.attrs["vocab"]), int(f.attrs["k"]), int(f.attrs["nwindows"])
    assert f.attrs["select"] in (b"topk", "topk")
    assert "checksum" in attrs

cases = []
# 'samples' may be missing (a cache made before documents: stream windows, which data_id
# also guards); every other attribute is required
OPTIONAL = {"samples"}
for a in attrs:
    for kind in ("array", "long string", "missing", "class"):
        if not (kind == "missing" and a in OPTIONAL):
            cases.append(attr_case(a, kind))
    if is_str(f0_attrs[a]):
        cases.append(attr_case(a, "long str"))
cases.append(value_case("samples", np.bytes_(b"documents, packed"), "other windows"))
cases += [value_case("format_version", np.int32(2), "2"),
          value_case("k", np.int32(0), "0"),
          value_case("k", np.int32(vocab + 1), "above vocab"),
          value_case("seq_len", np.int32(-16), "negative"),
          value_case("nwindows", np.int64(-1), "negative"),
          value_case("windows_done", np.int64(nw - 1), "one window short"),
          value_case("temperature", np.float64(-2.0), "negative"),
          value_case("temperature", np.float64(np.nan), "NaN"),
          value_case("select", np.bytes_(b"top"), "an unknown word")]
for d in ("ids", "logp", "tail", "crc"):
    for kind in ("missing", "half length", "flattened", "retyped"):
        cases.append(dset_case(d, kind))
cases += [entry_case("token id = vocab", ["/ids"], set_entries("ids", (slice(None), 0, 0), vocab)),
          entry_case("token id -1", ["/ids"], set_entries("ids", (slice(None), 3, k - 1), -1)),
          entry_case("token id 2^31 - 1", ["/ids"],
                     set_entries("ids", (slice(None), 1, 1), 2**31 - 1)),
          entry_case("NaN log-probability", ["/logp"],
                     set_entries("logp", (slice(None), 0, 0), np.nan)),
          entry_case("+inf log-probability", ["/logp"],
                     set_entries("logp", (slice(None), 2, 1), np.inf)),
          entry_case("NaN tail", ["/tail"], set_entries("tail", (slice(None), 0), np.nan)),
          entry_case("+inf tail", ["/tail"], set_entries("tail", (slice(None), 5), np.inf)),
          entry_case("a window changed, checksums not", ["checksum"],
                     set_entries("logp", (slice(None), 0, 0), -0.5), sealed=False),
          entry_case("window checksums resealed, file checksum not", ["'checksum'"],
                     set_entries("logp", (slice(None), 0, 0), -0.5), file_sum=False)]
size = os.path.getsize(cache)
FILE_CASES = []  # mutations of the bytes, not through h5py
for frac in (0.01, 0.3, 0.6, 0.95, 0.999):
    FILE_CASES.append((f"truncated to {frac:g} of its size",
                       lambda p, n=int(size * frac): os.truncate(p, n), []))
FILE_CASES.append(("not HDF5 (random bytes)",
                   lambda p: open(p, "wb").write(os.urandom(4096)), []))
cases = [(w, m, x, False) for w, m, x in cases] + [(w, m, x, True) for w, m, x in FILE_CASES]


def run(path, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        r = subprocess.run([kdtrain, base, f"run%out_dir='{out_dir}'", f"teacher%cache='{path}'"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "hang (60 s)"
    return r.returncode, r.stdout.decode(errors="replace")


st, out = run(cache, "fz")
if st != 0:
    print(out[-3000:])
    sys.exit("cache_fuzz: the unmutated cache does not train (exit %s)" % st)
# the same cache with every string attribute rewritten by h5py as a Python str (variable-length
# UTF-8): the same run
shutil.copy(cache, "str.h5")
with h5py.File("str.h5", "r+") as f:
    nstr = sum(1 for a in attrs if is_str(f.attrs[a]))
    for a in attrs:
        if is_str(f.attrs[a]):
            f.attrs[a] = f.attrs[a].decode()
st, out = run("str.h5", "fzs")


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as m:
        return [",".join(line.split(",")[:6]) for line in m]


if st != 0 or losses("fz") != losses("fzs"):
    print(out[-3000:])
    sys.exit(f"cache_fuzz: the cache with str attributes: exit {st}, or other losses")
print(f"cache_fuzz: the cache with its {nstr} string attributes as h5py's str trains as the original")

# the mutants are made one after another (h5py), read 2 at a time (a run mostly waits on
# process and MPI start-up, slow under the sanitizers)
mutants = []
for n, (what, mutate, fields, raw) in enumerate(cases):
    os.makedirs(f"m{n}", exist_ok=True)
    path = os.path.join(f"m{n}", MUT)
    shutil.copy(cache, path)
    if raw:
        mutate(path)
    else:
        with h5py.File(path, "r+") as f:
            mutate(f)
    mutants.append(path)
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda n: run(mutants[n], f"fz{n}"), range(len(cases))))

bad, refused = [], 0
for (what, mutate, fields, raw), path, (st, out) in zip(cases, mutants, results):
    clean = "Sanitizer" not in out and "runtime error" not in out
    named = path in out and all(x in out for x in fields)
    if st == 2 and clean and named:
        refused += 1
    else:
        why = "no file or field named" if st == 2 and clean else f"exit {st}"
        bad.append(f"{what}: {why}\n" + out[-1500:])

print(f"cache_fuzz: {len(cases)} hostile caches ({len(attrs)} root attributes x 4 kinds but a missing optional one, over-long str for the strings, "
      f"values out of range, 4 datasets x 4 kinds, bad entries, checksums, truncations, "
      f"not HDF5): {refused} refused with exit 2 naming file and field, {len(bad)} failures")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
