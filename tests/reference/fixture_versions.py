"""The one place a fixture generator records which peers, at which versions, made its fixtures.

Every generator (tests/reference/gen_*.py) ends with

    fixture_versions.write(OUT, __file__, inputs=[...files it read...])

which writes OUT/VERSIONS.json:

    {
     "generator": "tests/reference/gen_x.py",
     "inputs": {"stories260K.gguf": "<sha256>", ...},
     "machine": {"cpu": "AMD EPYC ...", "torch_cpu_capability": "AVX2"},
     "peers": {
      "numpy": "2.4.6",
      "torch": "2.15.0+cu132",
      ...
     },
     "python": "3.11.7"
    }

The peers are every package pinned in scripts/setup-reference.sh (the one list of pins, parsed
here) whose module this process has imported by then, directly or through another peer: a
generator cannot forget one it uses. Versions come from importlib.metadata (the installed
distribution, not a module's own __version__). A peer whose release differs from its pin stops
the generator before anything is recorded, so committed fixtures always match the pins; set
QLFT_REF_UNPINNED=1 to record anyway (the ctest reference_fixture_versions then fails until the
pins are moved too). tests/reference/check_fixture_versions.sh (ctest) checks every fixture
directory against the pins without Python; it reads the one-line-per-peer layout written here.
"""
import hashlib
import json
import os
import re
import sys
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SETUP = os.path.join(ROOT, "scripts", "setup-reference.sh")


def pins():
    """{distribution: version} from the `pins=( ... )` array and `smollm2_pkg=` of SETUP."""
    out, inside = {}, False
    with open(SETUP, encoding="utf-8") as f:
        for line in f:
            s = line.split("#", 1)[0].strip()
            if s.startswith("pins=("):
                inside = True
                continue
            if inside and s == ")":
                inside = False
                continue
            m = re.fullmatch(r"(?:smollm2_pkg=)?([A-Za-z0-9_.-]+)==([^\s]+)", s)
            if m and (inside or s.startswith("smollm2_pkg=")):
                out[m.group(1)] = m.group(2)
    if not out:
        sys.exit(f"fixture_versions: no pins found in {SETUP}")
    return out


def release(v):
    """torch's PyPI wheel reports a local tag (2.15.0+cu132); the release part is what is pinned."""
    return v.split("+", 1)[0]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def machine():
    """What besides the versions changes regenerated numbers: torch dispatches its CPU kernels by
    ISA (ATEN_CPU_CAPABILITY), and randn/exp differ in the last bit between AVX-512 and AVX2, so
    fixtures drawn from torch's generators are bit-reproducible only on the same capability."""
    out = {"cpu": "unknown"}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            out["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if "torch" in sys.modules:
        out["torch_cpu_capability"] = sys.modules["torch"].backends.cpu.get_cpu_capability()
    return out


def write(out_dir, generator, inputs=(), extra_peers=None):
    """Writes out_dir/VERSIONS.json. generator: the script's __file__. inputs: files read (their
    SHA-256 recorded by base name). extra_peers: {distribution: version} of peers that are not
    imported modules (e.g. the PyPI package a model file was taken from)."""
    want = pins()
    peers = {}
    for name in want:
        if name in sys.modules or name.replace("-", "_") in sys.modules:
            peers[name] = version(name)
    peers.update(extra_peers or {})
    if not peers:
        sys.exit("fixture_versions: no pinned peer imported; nothing to record")
    off = {n: (v, want.get(n)) for n, v in peers.items() if release(v) != want.get(n)}
    if off and os.environ.get("QLFT_REF_UNPINNED") != "1":
        sys.exit(f"fixture_versions: installed peers differ from scripts/setup-reference.sh "
                 f"(installed, pinned): {off}; run bash scripts/setup-reference.sh, or set "
                 f"QLFT_REF_UNPINNED=1 to record them anyway and move the pins")
    rec = {
        "generator": os.path.relpath(os.path.abspath(generator), ROOT),
        "inputs": {os.path.basename(p): sha256(p) for p in inputs},
        "machine": machine(),
        "peers": dict(sorted(peers.items())),
        "python": sys.version.split()[0],
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "VERSIONS.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    print("wrote", path, rec["peers"])
