#!/usr/bin/env bash
# Kernel resource report of the CUDA platform for sm_90 (H100/H200), no GPU needed: every .cu file
# of megatron/platforms/cuda is compiled again with the exact flags of the CMake build
# (compile_commands.json of a build dir configured with MG_CUDA=ON), its --generate-code replaced by
# sm_90 alone, plus -Xptxas=-v; ptxas' report is parsed into one table row per kernel: registers
# per thread, static shared memory, stack frame, spill stores/loads, barriers, and the occupancy
# the registers alone allow (warps per SM out of 64: 64K registers per SM, allocated per warp in
# units of 256, i.e. per thread rounded up to a multiple of 8; the block size and shared memory
# can lower it further). Kernel names are demangled (c++filt) and shortened to the function name
# plus template arguments.
#   bash benchmarks/ptxas_report.sh [build-dir, default build-bench-cuda] [out.md]
# Default output benchmarks/results/<date>-sm90-ptxas.md (+ .json). JOBS (default 2) parallel nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench-cuda}
date=$(date -u +%Y-%m-%d)
out=${2:-benchmarks/results/$date-sm90-ptxas.md}
if [ ! -f "$build/compile_commands.json" ] || ! grep -q '\.cu"' "$build/compile_commands.json"; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMG_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- megatron/platforms/cuda 2>/dev/null | grep -v '^??' || true)" ] &&
  commit="$commit+dirty"
nvcc_version=$(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -oE 'release [0-9.]+, V[0-9.]+' || echo "?")
python3 - "$build/compile_commands.json" "$tmp" "${JOBS:-2}" "$out" "$commit" "$date" \
  "$nvcc_version" <<'EOF'
import concurrent.futures, json, os, re, shlex, subprocess, sys
ccdb, tmp, jobs, out, commit, date, nvcc_version = sys.argv[1:]
entries = [e for e in json.load(open(ccdb)) if e["file"].endswith(".cu")]
if not entries:
    sys.exit("ptxas_report: no .cu files in " + ccdb)

def command(e, i):
    args = shlex.split(e["command"])
    keep, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("--generate-code") or a.startswith("-gencode") or a.startswith("-arch"):
            continue
        keep.append(a)
    return keep + ["--generate-code=arch=compute_90,code=sm_90", "-Xptxas=-v",
                   "-o", os.path.join(tmp, f"{i}.o")]

def compile_one(ie):
    i, e = ie
    p = subprocess.run(command(e, i), cwd=e["directory"], capture_output=True, text=True)
    return e["file"], p.returncode, p.stdout + p.stderr

results = []
with concurrent.futures.ThreadPoolExecutor(int(jobs)) as ex:
    for f, rc, text in ex.map(compile_one, enumerate(entries)):
        if rc != 0:
            sys.exit(f"ptxas_report: nvcc failed on {f}:\n{text[-3000:]}")
        results.append((f, text))

def demangle(names):
    if not names:
        return {}
    p = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, p.stdout.splitlines()))

def short(name):
    # drop the return type, namespaces and the parameter list: "ns::kernel<T, 4>(...)" ->
    # "kernel<T, 4>"
    name = name.replace("(anonymous namespace)", "anon")
    if name.startswith("void "):
        name = name[5:]
    depth, cut = 0, len(name)
    for j, ch in enumerate(name):
        if ch == "<": depth += 1
        elif ch == ">": depth -= 1
        elif ch == "(" and depth == 0:
            cut = j
            break
    base = name[:cut]
    depth, start = 0, 0
    for j, ch in enumerate(base):
        if ch == "<": depth += 1
        elif ch == ">": depth -= 1
        elif ch == ":" and depth == 0 and j + 1 < len(base) and base[j + 1] == ":":
            start = j + 2
    s = base[start:]
    for ns in ("mg::platforms::cuda::", "anon::", "mg::"):
        s = s.replace(ns, "")
    return s

rows = []
for f, text in results:
    cur, props = None, {}
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for 'sm_90'", line)
        if m:
            cur = m.group(1)
            props[cur] = {"file": os.path.basename(f)}
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            props.setdefault(cur, {"file": os.path.basename(f)})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and cur in props:
            props[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)),
                              spill_ld=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?", line)
        if m and cur in props:
            props[cur].update(regs=int(m.group(1)), barriers=int(m.group(2) or 0),
                              smem=int(m.group(3) or 0))
    for k, v in props.items():
        if "regs" in v:  # entry functions (device functions get only the properties line)
            v["mangled"] = k
            rows.append(v)

names = demangle([r["mangled"] for r in rows])
for r in rows:
    r["name"] = short(names.get(r["mangled"], r["mangled"]))
    per_thread = -(-r["regs"] // 8) * 8
    r["reg_warps"] = min(64, 65536 // (per_thread * 32)) if r["regs"] else 64
rows.sort(key=lambda r: (r["file"], r["name"]))
json.dump({"date": date, "commit": commit, "nvcc": nvcc_version, "arch": "sm_90",
           "kernels": rows}, open(os.path.splitext(out)[0] + ".json", "w"), indent=1)

spilling = [r for r in rows if r.get("spill_st", 0) or r.get("spill_ld", 0)]
stack = [r for r in rows if r.get("stack", 0) and r not in spilling]
low = [r for r in rows if r["reg_warps"] < 32]
L = [f"# sm_90 kernel resources (ptxas -v) of the CUDA platform", "",
     f"Commit {commit}, {date}, nvcc {nvcc_version}. Command: `bash benchmarks/ptxas_report.sh`: "
     f"each .cu of `megatron/platforms/cuda` compiled with the CMake build's flags for sm_90 only "
     f"plus `-Xptxas=-v`. {len(rows)} kernels (template instances) in {len(results)} files. "
     f"`reg warps` = warps per SM the registers allow (64 max; 65536 registers per SM, per thread "
     f"rounded up to 8); the block size and shared memory may lower occupancy further. Static "
     f"shared memory only: dynamic shared memory is set at launch. Full data: "
     f"`{os.path.basename(os.path.splitext(out)[0])}.json`.", "",
     f"- kernels that spill: {len(spilling)}" + (": " + ", ".join(
         f"{r['file']}:{r['name']} ({r['spill_st']}/{r['spill_ld']} B)" for r in spilling[:12])
         if spilling else ""),
     f"- kernels with a stack frame but no spills (local arrays, calls): {len(stack)}" + (
         ": " + ", ".join(f"{r['file']}:{r['name']} ({r['stack']} B)" for r in stack[:12])
         if stack else ""),
     f"- kernels whose registers allow fewer than 32 warps/SM (< 50% occupancy): {len(low)}" + (
         ": " + ", ".join(f"{r['file']}:{r['name']} ({r['regs']} regs)" for r in low[:16])
         if low else ""),
     "", "| file | kernel | regs | reg warps | smem B | stack B | spill st/ld B | barriers |",
     "|---|---|---|---|---|---|---|---|"]
for r in rows:
    L.append(f"| {r['file']} | `{r['name'][:110]}` | {r['regs']} | {r['reg_warps']} | "
             f"{r.get('smem', 0)} | {r.get('stack', 0)} | {r.get('spill_st', 0)}/"
             f"{r.get('spill_ld', 0)} | {r.get('barriers', 0)} |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L[:10]))
print(f"... {len(rows)} rows in {out}")
EOF
