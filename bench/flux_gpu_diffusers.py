#!/usr/bin/env python3
"""diffusers' FluxTransformer2DModel at FLUX.1-dev's size on one device, eager and compiled: the
reference bench_flux_gpu is held against (bench/gpu_flux.sh runs both in one job).

Same shapes and timing as bench_flux_gpu: seeded N(0, 0.02) weights made on the device, a
1024x1024 image (4096 tokens) and 512 text tokens, batch 1, the median of --reps forwards after
--warmup, each timed between device synchronisations. Writes one JSON object (--out, or stdout).
Smaller --heads / blocks / sizes and --device cpu run the same code as a smoke test.
"""
import argparse
import json
import statistics
import sys
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--double-blocks", type=int, default=19)
    p.add_argument("--single-blocks", type=int, default=38)
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kernels", help="write the device kernels of one profiled eager forward "
                   "(name, calls, microseconds) to this JSON file")
    p.add_argument("--out")
    a = p.parse_args()

    from diffusers import FluxTransformer2DModel
    import diffusers

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    with torch.device(dev):
        model = FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=a.double_blocks,
            num_single_layers=a.single_blocks, attention_head_dim=128,
            num_attention_heads=a.heads, joint_attention_dim=4096, pooled_projection_dim=768,
            guidance_embeds=True, axes_dims_rope=(16, 56, 56)).to(dtype)
    with torch.no_grad():
        for prm in model.parameters():
            prm.normal_(0.0, 0.02)
    model.eval()

    gh, gw = a.height // 16, a.width // 16
    n = gh * gw
    f32 = dict(device=dev, dtype=torch.float32)
    inputs = dict(
        hidden_states=torch.randn(1, n, 64, **f32).to(dtype),
        encoder_hidden_states=torch.randn(1, a.text_tokens, 4096, **f32).to(dtype),
        pooled_projections=torch.randn(1, 768, **f32).to(dtype),
        timestep=torch.full((1,), 0.5, **f32).to(dtype),
        guidance=torch.full((1,), 3.5, **f32),
        img_ids=torch.stack([torch.zeros(n, **f32), torch.arange(gh, **f32).repeat_interleave(gw),
                             torch.arange(gw, **f32).repeat(gh)], 1),
        txt_ids=torch.zeros(a.text_tokens, 3, **f32),
        return_dict=False)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def measure(fn):
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(a.warmup):
                fn(**inputs)
            sync()
            first = time.perf_counter() - t0
            times = []
            for _ in range(a.reps):
                sync()
                t = time.perf_counter()
                out = fn(**inputs)[0]
                sync()
                times.append(time.perf_counter() - t)
        assert torch.isfinite(out.float()).all(), "non-finite output"
        med = statistics.median(times)
        return {"seconds": times, "ms_per_step": med * 1e3, "min_ms_per_step": min(times) * 1e3,
                "s_per_image_transformer": med * a.steps, "warmup_seconds": first}

    # The SDPA kernel PyTorch picks for this model's attention ([1, heads, tokens, 128]), which
    # diffusers' eager forward runs (xfuser's automatic choice asks the same question).
    sdpa_backend = None
    if dev.type == "cuda" and hasattr(torch, "_fused_sdp_choice"):
        q = torch.empty(1, a.heads, n + a.text_tokens, 128, device=dev, dtype=dtype)
        names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
        sdpa_backend = names.get(int(torch._fused_sdp_choice(q, q, q)), "unknown")

    result = {"benchmark": "flux_dev_transformer", "engine": "diffusers",
              "sdpa_backend": sdpa_backend,
              "diffusers": diffusers.__version__, "torch": torch.__version__,
              "device": str(dev), "dtype": a.dtype, "height": a.height, "width": a.width,
              "image_tokens": n, "text_tokens": a.text_tokens, "heads": a.heads,
              "double_blocks": a.double_blocks, "single_blocks": a.single_blocks,
              "parameters": sum(prm.numel() for prm in model.parameters()), "steps": a.steps,
              "eager": measure(model)}
    print(f"diffusers eager: {result['eager']['ms_per_step']:.2f} ms/step", file=sys.stderr)
    if a.kernels:
        write_kernels(model, inputs, sync, a.kernels)
    if a.compile:
        compiled = torch.compile(model)
        result["compiled"] = measure(compiled)
        print(f"diffusers torch.compile: {result['compiled']['ms_per_step']:.2f} ms/step "
              f"(warm-up incl. compile {result['compiled']['warmup_seconds']:.1f} s)",
              file=sys.stderr)
    text = json.dumps(result, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


def write_kernels(model, inputs, sync, path):
    """One eager forward under PyTorch's profiler: each device kernel's calls and microseconds,
    the same summary bench_flux_gpu --kernels writes."""
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        sync()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            model(**inputs)
            sync()
    kernels = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels.setdefault(e.name, {"name": e.name, "calls": 0, "us": 0.0})
        k["calls"] += 1
        k["us"] += e.time_range.elapsed_us()
    rows = sorted(kernels.values(), key=lambda k: -k["us"])
    with open(path, "w") as f:
        json.dump({"engine": "diffusers", "total_us": sum(k["us"] for k in rows),
                   "calls": sum(k["calls"] for k in rows), "kernels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
