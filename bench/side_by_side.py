#!/usr/bin/env python3
"""xfuser against diffusers on the CPU, on the same pipeline folders, in one job.

For every model, dtype, thread count and cache method the two runners generate from the same
initial latents, one after the other (diffusers, xfuser, diffusers, xfuser, ...), so machine load
falls on both alike. Writes one JSON object: per setting each runner's median generation time
and median denoising time, the transformer calls each computed and skipped, and the ratios
diffusers / xfuser (above 1: xfuser is faster); per model and dtype xfuser's cached runs against
its own uncached run. Run it with the Python that has torch and diffusers (the "same libtorch"
comparison needs xfuser built against that torch: see bench/README.md).

Models (folders written under --work with seeded random weights, by diffusers' save_pretrained):
  flux_small   FluxPipeline: transformer 4 double + 8 single blocks, 4 heads x 128 (hidden 512),
               the tiny CLIP / T5 of tests/fixtures/pipelines/flux-tiny, a VAE of
               16..64 channels; 512x512 (1024 image tokens), 128 text tokens, guidance 3.5
               (one transformer call a step), 4 steps
  wan_small    WanPipeline (Wan 2.1): transformer 6 layers, 4 heads x 128, FFN 2048, the tiny
               UMT5 of tests/fixtures/pipelines/wan-t2v-tiny, a Wan VAE of base dim 8;
               33 frames of 256x256 (2304 video tokens), 128 text tokens, CFG 5.0 (two calls a
               step), 4 steps
  tiny_shapes  the committed, trained models/flux/tiny_shapes: 96x96, 16 steps, guidance 3.5

Cache methods (parameters as both runners name them; diffusers has no TeaCache hook, so
teacache is timed in xfuser alone and compared with xfuser's uncached run):
  none, fbcache (threshold 0.05 / 0.2 on tiny_shapes), taylorseer (interval 3, lite mode),
  magcache (threshold 0.24, FLUX.1's published ratios on every model), teacache (threshold 0.4,
  FLUX only)

Times: a generation is the pipeline call (text encoding, denoising, decoding to pixels);
denoising runs from the first transformer call to the end of the last step. xfuser's come from
its timings_rank0.json (total_seconds; the denoise_step stages), diffusers' from wall clocks
around the call, a forward pre-hook on the transformer and callback_on_step_end. Per setting:
diffusers warms up once (an untimed call after the settings change) and runs half its timed
generations, then one xfuser-run process loads the folder, warms up (--warmup_calls 1) and runs
its timed generations back to back, then diffusers runs the other half; medians are reported.

Usage: bench/side_by_side.py --xfuser BUILD/bin/xfuser-run [--models a,b] [--dtypes fp32,bf16]
         [--threads 1,2] [--caches none,fbcache,...] [--reps N] [--work DIR] [--out FILE]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "pipelines"
PROMPT = "a large red circle at the top left on a blue background"
NEGATIVE = "blurry, low quality"

MODELS = {
    "flux_small": dict(kind="flux", height=512, width=512, steps=4, guidance=3.5, text=128),
    "wan_small": dict(kind="wan", height=256, width=256, frames=33, steps=4, guidance=5.0,
                      text=128),
    "tiny_shapes": dict(kind="flux", height=96, width=96, steps=16, guidance=3.5, text=56,
                        folder=ROOT / "models" / "flux" / "tiny_shapes"),
}

CACHES = ["none", "fbcache", "taylorseer", "magcache", "teacache"]


def cache_settings(method, model):
    """(diffusers config or None, xfuser flags) for one method; None when it does not apply."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS
    steps = MODELS[model]["steps"]
    if method == "none":
        return None, []
    if method == "fbcache":
        t = 0.2 if model == "tiny_shapes" else 0.05
        return FirstBlockCacheConfig(threshold=t), ["--cache", "fbcache", "--cache_threshold",
                                                   str(t)]
    if method == "taylorseer":
        cfg = TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=1, max_order=1,
                                    use_lite_mode=True)
        return cfg, ["--cache", "taylorseer", "--cache_interval", "3",
                     "--cache_disable_before_step", "1", "--cache_max_order", "1"]
    if method == "magcache":
        ratios = [float(r) for r in FLUX_MAG_RATIOS.tolist()]
        cfg = MagCacheConfig(threshold=0.24, max_skip_steps=3, retention_ratio=0.2,
                             num_inference_steps=steps, mag_ratios=torch.tensor(ratios))
        return cfg, ["--cache", "magcache", "--cache_threshold", "0.24",
                     "--cache_max_skip_steps", "3", "--cache_retention_ratio", "0.2",
                     "--cache_mag_ratios", ",".join(repr(r) for r in ratios)]
    if method == "teacache":
        if MODELS[model]["kind"] != "flux":
            return "skip", None
        return "xfuser-only", ["--cache", "teacache", "--cache_threshold", "0.4"]
    raise SystemExit(f"side_by_side: unknown cache method '{method}' (--caches takes "
                     f"{','.join(CACHES)})")


# ---- folders -----------------------------------------------------------------------------------


def make_flux_small(dst, seed=7):
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    shutil.copytree(FIXTURES / "flux-tiny", dst)
    torch.manual_seed(seed)
    t = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=4, num_single_layers=8,
                               attention_head_dim=128, num_attention_heads=4,
                               joint_attention_dim=48, pooled_projection_dim=32,
                               guidance_embeds=True, axes_dims_rope=[16, 56, 56])
    shutil.rmtree(dst / "transformer")
    t.save_pretrained(dst / "transformer", safe_serialization=True)
    old = json.loads((dst / "vae" / "config.json").read_text())
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                        block_out_channels=[16, 32, 64, 64], layers_per_block=1,
                        norm_num_groups=16, down_block_types=["DownEncoderBlock2D"] * 4,
                        up_block_types=["UpDecoderBlock2D"] * 4, use_quant_conv=False,
                        use_post_quant_conv=False, scaling_factor=old["scaling_factor"],
                        shift_factor=old["shift_factor"], sample_size=512)
    shutil.rmtree(dst / "vae")
    vae.save_pretrained(dst / "vae", safe_serialization=True)


def make_wan_small(dst, seed=7):
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    shutil.copytree(FIXTURES / "wan-t2v-tiny", dst)
    torch.manual_seed(seed)
    t = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=128,
                              in_channels=16, out_channels=16, text_dim=32, freq_dim=256,
                              ffn_dim=2048, num_layers=6, cross_attn_norm=True,
                              qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)
    shutil.rmtree(dst / "transformer")
    t.save_pretrained(dst / "transformer", safe_serialization=True)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    shutil.rmtree(dst / "vae")
    vae.save_pretrained(dst / "vae", safe_serialization=True)


def folder_for(model, work):
    spec = MODELS[model]
    if "folder" in spec:
        return spec["folder"]
    dst = work / model
    if not (dst / "model_index.json").exists():
        if dst.exists():
            shutil.rmtree(dst)
        {"flux_small": make_flux_small, "wan_small": make_wan_small}[model](dst)
    return dst


def initial_latents(pipe, model, seed=42):
    spec = MODELS[model]
    g = torch.Generator().manual_seed(seed)
    if spec["kind"] == "flux":
        c = pipe.transformer.config.in_channels
        n = (spec["height"] // 16) * (spec["width"] // 16)
        return torch.randn(1, n, c, generator=g)
    f = (spec["frames"] - 1) // 4 + 1
    return torch.randn(1, 16, f, spec["height"] // 8, spec["width"] // 8, generator=g)


# ---- the two runners ---------------------------------------------------------------------------


class Diffusers:
    def __init__(self, folder, model, dtype):
        from diffusers import DiffusionPipeline
        self.spec = MODELS[model]
        self.model = model
        self.pipe = DiffusionPipeline.from_pretrained(str(folder), torch_dtype=dtype,
                                                      local_files_only=True)
        self.pipe.set_progress_bar_config(disable=True)
        self.dtype = dtype
        t = self.pipe.transformer
        # The last block's query projection runs only when the blocks really compute: a cache
        # hook that skips replaces the block's (or its attention's) forward, and hooks on those
        # would count the call, not the work.
        last = (t.single_transformer_blocks[-1].attn if self.spec["kind"] == "flux"
                else t.blocks[-1].attn1).to_q
        self.first_call = None
        self.computed = 0
        self.calls = 0
        t.register_forward_pre_hook(self._on_transformer)
        last.register_forward_pre_hook(self._on_last_block)

    def _on_transformer(self, module, args):
        self.calls += 1
        if self.first_call is None:
            self.first_call = time.perf_counter()

    def _on_last_block(self, module, args):
        self.computed += 1

    def set_cache(self, config):
        t = self.pipe.transformer
        if t.is_cache_enabled:
            t.disable_cache()
        if config is not None:
            t.enable_cache(config)

    def generate(self, latents):
        s = self.spec
        kw = dict(prompt=PROMPT, num_inference_steps=s["steps"], guidance_scale=s["guidance"],
                  height=s["height"], width=s["width"], max_sequence_length=s["text"],
                  latents=latents.to(self.dtype), output_type="pil")
        if s["kind"] == "wan":
            kw.update(negative_prompt=NEGATIVE, num_frames=s["frames"])
        ends = []

        def on_step(pipe, i, t, kwargs):
            ends.append(time.perf_counter())
            return kwargs

        self.first_call, self.computed, self.calls = None, 0, 0
        start = time.perf_counter()
        with torch.inference_mode():
            self.pipe(**kw, callback_on_step_end=on_step)
        total = time.perf_counter() - start
        return {"total_seconds": total, "denoise_seconds": ends[-1] - self.first_call,
                "computed": self.computed, "skipped": self.calls - self.computed}


def run_xfuser(binary, folder, model, dtype, threads, latents_file, cache_flags, out_dir, reps):
    """One xfuser-run process: a warm-up generation, then `reps` timed ones (one dict each)."""
    s = MODELS[model]
    cmd = [str(binary), "--model_path", str(folder), "--prompt", PROMPT,
           "--height", str(s["height"]), "--width", str(s["width"]),
           "--num_inference_steps", str(s["steps"]), "--guidance_scale", str(s["guidance"]),
           "--max_sequence_length", str(s["text"]), "--seed", "42",
           "--latents", str(latents_file), "--dtype", dtype, "--device", "cpu",
           "--warmup_calls", "1", "--num_iterations", str(reps),
           "--output_directory", str(out_dir), "--log_level", "warn"] + cache_flags
    if s["kind"] == "wan":
        cmd += ["--negative_prompt", NEGATIVE, "--num_frames", str(s["frames"])]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"side_by_side: xfuser-run failed ({r.returncode}): {' '.join(cmd)}\n"
                         f"{r.stderr[-4000:]}")
    report = json.loads((out_dir / "timings_rank0.json").read_text())
    runs = []
    for it in report["iterations"][-reps:]:
        out = {"total_seconds": it["total_seconds"], "stages": {},
               "attention_kernel_calls": report.get("attention_kernel_calls")}
        for st in it["stages"]:
            out["stages"][st["name"]] = out["stages"].get(st["name"], 0.0) + st["seconds"]
        out["denoise_seconds"] = out["stages"].get("denoise_step", 0.0)
        if "cache" in it:
            out["computed"], out["skipped"] = it["cache"]["computed"], it["cache"]["skipped"]
        runs.append(out)
    return runs


def med(runs, key):
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else None


def summarise(runs):
    if not runs:
        return None
    out = {"total_seconds": med(runs, "total_seconds"),
           "denoise_seconds": med(runs, "denoise_seconds"),
           "runs": [{k: v for k, v in r.items() if k != "attention_kernel_calls"} for r in runs]}
    for k in ("computed", "skipped"):
        if k in runs[-1]:
            out[k] = runs[-1][k]
    if runs[-1].get("attention_kernel_calls") is not None:
        out["attention_kernel_calls"] = runs[-1]["attention_kernel_calls"]
    return out


def libtorch_of(binary):
    """The Torch_DIR the xfuser build was configured with (its CMakeCache.txt)."""
    cache = Path(binary).resolve().parent.parent / "CMakeCache.txt"
    if cache.exists():
        for line in cache.read_text().splitlines():
            if line.startswith("Torch_DIR:"):
                return line.split("=", 1)[1]
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xfuser", required=True, help="path to xfuser-run")
    p.add_argument("--models", default="flux_small,wan_small,tiny_shapes")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--caches", default=",".join(CACHES))
    p.add_argument("--reps", type=int, default=2, help="timed generations per runner and setting")
    p.add_argument("--work", help="folder for the pipelines (kept; default a temporary one)")
    p.add_argument("--out", help="JSON file (default stdout)")
    a = p.parse_args()

    import diffusers
    from safetensors.torch import save_file
    binary = Path(a.xfuser).resolve()
    if not binary.exists():
        raise SystemExit(f"side_by_side: --xfuser {binary} does not exist")
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"side_by_side: unknown model '{m}' (--models takes "
                             f"{','.join(MODELS)})")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for d in a.dtypes.split(","):
        if d not in dtypes:
            raise SystemExit(f"side_by_side: unknown dtype '{d}' (--dtypes takes fp32,bf16)")
    threads = [int(t) for t in a.threads.split(",")]
    caches = a.caches.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="xfuser-side-"))
    work = Path(a.work) if a.work else tmp
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": platform.processor(),
              "torch": torch.__version__, "diffusers": diffusers.__version__,
              "xfuser": str(binary), "xfuser_torch_dir": libtorch_of(binary),
              "reps": a.reps, "settings": [], "cache_speedups": []}
    try:
        for model in models:
            folder = folder_for(model, work)
            for dname in a.dtypes.split(","):
                ref = Diffusers(folder, model, dtypes[dname])
                latents = initial_latents(ref.pipe, model)
                lat_file = tmp / f"{model}.latents.safetensors"
                save_file({"latents": latents.contiguous()}, str(lat_file))
                for n in threads:
                    torch.set_num_threads(n)
                    uncached = None
                    for method in caches:
                        d_cfg, x_flags = cache_settings(method, model)
                        if d_cfg == "skip":
                            continue
                        only_x = d_cfg == "xfuser-only"
                        if not only_x:
                            ref.set_cache(d_cfg)
                            ref.generate(latents)  # warm-up with these settings
                        # diffusers before and after xfuser's process, which runs its
                        # generations back to back after its own warm-up
                        d_runs = []
                        if not only_x:
                            d_runs += [ref.generate(latents) for _ in range(a.reps // 2)]
                        x_runs = run_xfuser(binary, folder, model, dname, n, lat_file, x_flags,
                                            tmp / "out", a.reps)
                        if not only_x:
                            d_runs += [ref.generate(latents)
                                       for _ in range(a.reps - a.reps // 2)]
                        entry = {"model": model, "dtype": dname, "threads": n, "cache": method,
                                 "diffusers": summarise(d_runs), "xfuser": summarise(x_runs)}
                        if d_runs:
                            entry["ratio_total"] = (entry["diffusers"]["total_seconds"] /
                                                    entry["xfuser"]["total_seconds"])
                            entry["ratio_denoise"] = (entry["diffusers"]["denoise_seconds"] /
                                                      entry["xfuser"]["denoise_seconds"])
                        if method == "none":
                            uncached = entry["xfuser"]
                        elif uncached is not None:
                            result["cache_speedups"].append({
                                "model": model, "dtype": dname, "threads": n, "cache": method,
                                "xfuser_denoise_speedup": uncached["denoise_seconds"] /
                                entry["xfuser"]["denoise_seconds"],
                                "xfuser_total_speedup": uncached["total_seconds"] /
                                entry["xfuser"]["total_seconds"]})
                        result["settings"].append(entry)
                        r = entry.get("ratio_denoise")
                        print(f"{model:12s} {dname} {n}t {method:10s} "
                              f"xfuser {entry['xfuser']['denoise_seconds']:.2f}s denoise / "
                              f"{entry['xfuser']['total_seconds']:.2f}s total"
                              + (f"  diffusers {entry['diffusers']['denoise_seconds']:.2f}s / "
                                 f"{entry['diffusers']['total_seconds']:.2f}s  ratio "
                                 f"{r:.2f} / {entry['ratio_total']:.2f}" if r else ""),
                              file=sys.stderr, flush=True)
                ref.set_cache(None)
                del ref
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["elapsed_seconds"] = time.time() - started
    text = json.dumps(result, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
