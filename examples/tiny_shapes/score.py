"""The measured criterion of a tiny-shapes picture (tests/test_tiny_shapes.cpp checks the same).

Every pixel is named by its nearest palette colour (RGB distance). A picture passes when
  - for each shape of the caption, in the central 24x24 box of its cell: the pixels not of the
    background colour are at least 20% of the box, and the named colour is the most common of them;
  - in the cells the caption leaves empty, at least 90% of the pixels are of the background colour.

    V/bin/python examples/tiny_shapes/score.py --pipeline models/flux/tiny_shapes [--count 100]
scores held-out scenes (spread over the list) through diffusers' FluxPipeline.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes  # noqa: E402

BOX = 24
STEPS = 16


def classify(img):
    names = list(shapes.COLOURS)
    pal = np.array([shapes.COLOURS[c] for c in names], dtype=np.float32)
    d = ((img[:, :, None, :].astype(np.float32) - pal[None, None]) ** 2).sum(-1)
    return d.argmin(-1), names


def check(img, scene):
    cls, names = classify(img)
    bg, items = scene
    bgi = names.index(bg)
    ok = True
    detail = []
    used = set()
    for kind, colour, size, place in items:
        used.add(place)
        cx, cy = shapes.cell_center(place)
        x0, y0 = int(round(cx - BOX / 2)), int(round(cy - BOX / 2))
        box = cls[y0:y0 + BOX, x0:x0 + BOX].ravel()
        fg = box[box != bgi]
        frac = fg.size / box.size
        dominant = names[np.bincount(fg, minlength=len(names)).argmax()] if fg.size else None
        good = frac >= 0.2 and dominant == colour
        ok &= good
        detail.append({"place": list(place), "colour": colour, "dominant": dominant,
                       "foreground": round(float(frac), 3)})
    for place in shapes.PLACES:
        if place in used:
            continue
        r, c = place
        y0, y1 = int(round(r * shapes.CELL)), int(round((r + 1) * shapes.CELL))
        x0, x1 = int(round(c * shapes.CELL)), int(round((c + 1) * shapes.CELL))
        frac = float((cls[y0:y1, x0:x1] == bgi).mean())
        if frac < 0.9:
            ok = False
            detail.append({"empty_place": list(place), "background": round(frac, 3)})
    return bool(ok), detail


def spread(scenes, count):
    """`count` of `scenes` spread evenly over the list (held-out scenes are sorted by background:
    of the first 48, 37 are on red). tests/test_tiny_shapes.cpp picks the same ones."""
    return [scenes[i * len(scenes) // count] for i in range(count)]


def score_pipeline(folder, scenes, max_seq, preview=None):
    import torch
    from diffusers import FluxPipeline
    from PIL import Image
    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    passed, fails, imgs = 0, [], []
    for i, scene in enumerate(scenes):
        cap = shapes.caption(scene)
        out = pipe(cap, height=shapes.SIZE, width=shapes.SIZE, num_inference_steps=STEPS,
                   max_sequence_length=max_seq, guidance_scale=3.5,
                   generator=torch.Generator().manual_seed(i), output_type="np").images[0]
        img = (out * 255).round().clip(0, 255).astype(np.uint8)
        ok, detail = check(img, scene)
        passed += ok
        if not ok:
            fails.append({"caption": cap, "detail": detail})
        if len(imgs) < 16:
            imgs.append(img)
    if preview is not None and len(imgs) >= 4:  # rows of 4 pictures
        grid = np.concatenate([np.concatenate(imgs[r * 4:r * 4 + 4], 1)
                               for r in range(len(imgs) // 4)], 0)
        Image.fromarray(grid).save(preview)
    return {"scenes": len(scenes), "passed": passed, "rate": passed / max(1, len(scenes)),
            "first_failures": fails[:10]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", required=True, type=Path)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--max_sequence_length", type=int, default=32)
    ap.add_argument("--preview", type=Path)
    args = ap.parse_args()
    held = json.loads((Path(__file__).resolve().parent / "heldout.json").read_text())["scenes"]
    scenes = [(h["background"], tuple((s["kind"], s["colour"], s["size"], (s["row"], s["col"]))
                                      for s in h["shapes"])) for h in spread(held, args.count)]
    print(json.dumps(score_pipeline(args.pipeline, scenes, args.max_sequence_length,
                                    args.preview), indent=1))


if __name__ == "__main__":
    main()
