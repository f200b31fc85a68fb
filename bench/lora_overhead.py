#!/usr/bin/env python3
"""What a LoRA adapter costs per denoising step: fused (into the weights at load) and unfused
(beside them, every Linear call), against no adapter, in one job.

    bench/lora_overhead.py --pipeline DIR [--build-dir build] [--rank 16] [--reps 3] [--out FILE]

DIR is a FLUX.1 pipeline folder (the side-by-side benchmark writes FLUX small into its work
folder: bench/side_by_side.py --keep). The script writes a random rank-r adapter in the diffusers
layout (transformer.<module>.lora_A / lora_B) on every attention projection and MLP linear of the
transformer, then runs xfuser-run --num_iterations 2 (the first is a warm-up) for no adapter,
fused and unfused, interleaved `reps` times, and reads each run's denoising step times from
timings_rank0.json. The JSON gives the medians per mode and their ratios to the run without an
adapter, and the load time of each mode (the fused mode pays its products there).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
           "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out", "proj_mlp", "ff.net.0.proj",
           "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")


def read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)


def make_adapter(pipeline, rank, path):
    header = read_header(pipeline / "transformer" / "diffusion_pytorch_model.safetensors")
    rng = np.random.default_rng(0)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or not name.endswith(".weight"):
            continue
        module = name[:-len(".weight")]
        if not module.endswith(TARGETS) or module.startswith("single_transformer_blocks") and \
                module.endswith("proj_out"):
            continue
        out_f, in_f = info["shape"]
        tensors[f"transformer.{module}.lora_A.weight"] = rng.standard_normal((rank, in_f)) * 0.01
        tensors[f"transformer.{module}.lora_B.weight"] = rng.standard_normal((out_f, rank)) * 0.01
    write_safetensors(path, tensors)
    return len(tensors) // 2


def run(binary, pipeline, args, out_dir):
    cmd = [binary, "--model_path", str(pipeline), "--prompt", "a cat", "--height",
           str(args.size), "--width", str(args.size), "--num_inference_steps", str(args.steps),
           "--dtype", args.dtype, "--num_iterations", "2", "--output_directory", str(out_dir)]
    cmd += args.extra
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.time() - t0
    report = json.loads((out_dir / "timings_rank0.json").read_text())
    steps = [s["seconds"] for s in report["iterations"][-1]["stages"]
             if s["name"] == "denoise_step"]
    return statistics.median(steps), wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", type=Path, required=True)
    ap.add_argument("--build-dir", type=Path, default=Path("build"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--out", type=Path, default=Path("bench/results/lora_overhead.json"))
    args = ap.parse_args()
    args.extra = []
    binary = str(args.build_dir / "bin" / "xfuser-run")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        adapter = tmp / "adapter.safetensors"
        layers = make_adapter(args.pipeline, args.rank, adapter)
        modes = {"none": [], "fused": ["--lora", str(adapter)],
                 "unfused": ["--lora", str(adapter), "--lora_mode", "unfused"]}
        steps = {m: [] for m in modes}
        walls = {m: [] for m in modes}
        for rep in range(args.reps):
            for mode, extra in modes.items():
                args.extra = extra
                step, wall = run(binary, args.pipeline, args, tmp / f"{mode}{rep}")
                steps[mode].append(step)
                walls[mode].append(wall)
                print(f"rep {rep} {mode:8s} step {step:.3f} s, process {wall:.1f} s", flush=True)
    result = {
        "pipeline": str(args.pipeline), "rank": args.rank, "adapted_layers": layers,
        "size": args.size, "steps": args.steps, "dtype": args.dtype, "reps": args.reps,
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "load_average": os.getloadavg()[0],
        "step_seconds_median": {m: statistics.median(v) for m, v in steps.items()},
        "process_seconds_median": {m: statistics.median(v) for m, v in walls.items()},
        "step_seconds": steps,
    }
    base = result["step_seconds_median"]["none"]
    result["step_ratio_to_none"] = {m: v / base for m, v in result["step_seconds_median"].items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("step_seconds_median", "step_ratio_to_none",
                                             "process_seconds_median")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
