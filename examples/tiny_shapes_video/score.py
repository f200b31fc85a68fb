"""Scores a tiny-shapes-video pipeline folder on the held-out clips through diffusers' WanPipeline
(the world's checker on every frame; see world.check_clip).

    V/bin/python examples/tiny_shapes_video/score.py models/wan/tiny_shapes_video \\
        [--sets canonical,free,unknown] [--limit N] [--json out.json] [--strip out.png]

Each clip is made from its own seed (the held-out index), STEPS steps, guidance GUIDANCE, the
held-out text length. Prints each set's pass rate, per motion too.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import world  # noqa: E402

STEPS = 20
GUIDANCE = 5.0


def load(folder):
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(folder, torch_dtype=torch.float32, low_cpu_mem_usage=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, caption, seed, max_seq, steps=STEPS, guidance=GUIDANCE):
    """uint8 [FRAMES, SIZE, SIZE, 3] (diffusers' np output rounded as xfuser writes frames)."""
    out = pipe(prompt=caption, height=world.SIZE, width=world.SIZE, num_frames=world.FRAMES,
               num_inference_steps=steps, guidance_scale=guidance, max_sequence_length=max_seq,
               generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
    return (np.clip(out, 0, 1) * 255).round().astype(np.uint8)


def score(pipe, held, sets, limit=0):
    max_seq = held["max_sequence_length"]
    result = {}
    for name in sets:
        items = held["sets"][name][:limit or None]
        passed, per_motion, rows = 0, {}, []
        for i, it in enumerate(items):
            frames = generate(pipe, it["caption"], i, max_seq)
            ok, details = world.check_clip(frames, it["colour"], it["background"], it["motion"])
            passed += ok
            m = per_motion.setdefault(it["motion"], [0, 0])
            m[0] += ok
            m[1] += 1
            rows.append({"caption": it["caption"], **details})
        result[name] = {"passed": passed, "of": len(items),
                        "rate": round(100.0 * passed / max(1, len(items)), 1),
                        "per_motion": {k: f"{a}/{b}" for k, (a, b) in per_motion.items()},
                        "clips": rows}
        print(f"{name}: {passed}/{len(items)} ({result[name]['rate']}%) " +
              " ".join(f"{k} {v}" for k, v in result[name]["per_motion"].items()), flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--heldout", type=Path, default=HERE / "heldout.json")
    ap.add_argument("--sets", default="canonical,free,unknown")
    ap.add_argument("--limit", type=int, default=0, help="the first N of each set (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    held = json.loads(args.heldout.read_text())
    result = score(load(args.folder), held, args.sets.split(","), args.limit)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
