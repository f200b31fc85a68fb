"""The scene and shape checker of tiny-shapes (tests/test_tiny_shapes.cpp checks the same, through
examples/tiny_shapes/scene_check.h).

Every pixel is named by its nearest palette colour (RGB distance). Then, for a picture and the
scene its caption describes:
  - colour and place (captions that say the places): for each shape, the central BOX x BOX box of
    its cell holds at least 20% pixels not of the background colour, and the named colour is the
    most common of them; every cell no shape is in is at least 90% background colour;
  - colour, places free (captions that leave the places out): the same, with the cells found
    rather than named: each cell whose central box holds 20% non-background pixels is an
    occupied cell, named by its most common colour; the occupied cells' colours, as a multiset,
    are the shapes' colours, and the other cells are 90% background;
  - kind: in each shape's cell (widened by MARGIN pixels), the largest 4-connected component of
    the named colour is measured: `fill` (its area over its bounding box's) and `top` (the share
    of it in the upper half of its box): a circle fills 0.79 of its box, a square 1, an upright
    triangle 0.5 with a quarter of it in the upper half. The nearest of the kinds' prototypes
    (the same measures on drawn shapes, `prototypes`) is the kind drawn.
A scene passes when its colours and places are right and each shape is of its kind.

    V/bin/python examples/tiny_shapes/score.py --pipeline models/flux/tiny_shapes [--count 100]
scores the held-out sets (heldout.json) through diffusers' FluxPipeline.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes  # noqa: E402

STEPS = 16
BOX = 16  # the central box of a cell whose colours are checked
MARGIN = 4  # pixels the cell is widened by when a shape's component is measured
FOREGROUND = 0.2
EMPTY = 0.9
# The scale of each measure in the nearest-prototype distance.
SPREAD = {"fill": 0.1, "top": 0.08}


def classify(img, palette):
    names = list(palette)
    pal = np.array([palette[c] for c in names], dtype=np.float32)
    d = ((img[:, :, None, :].astype(np.float32) - pal[None, None]) ** 2).sum(-1)
    return d.argmin(-1), names


def cell_bounds(place, size, grid, margin=0):
    cell = size / grid
    r, c = place
    y0 = max(0, int(round(r * cell)) - margin)
    y1 = min(size, int(round((r + 1) * cell)) + margin)
    x0 = max(0, int(round(c * cell)) - margin)
    x1 = min(size, int(round((c + 1) * cell)) + margin)
    return y0, y1, x0, x1


def largest_component(mask):
    """The largest 4-connected component of a boolean mask, as a mask."""
    h, w = mask.shape
    label = np.zeros((h, w), dtype=np.int32)
    best, best_size, n = 0, 0, 0
    for y in range(h):
        for x in range(w):
            if not mask[y, x] or label[y, x]:
                continue
            n += 1
            stack, count = [(y, x)], 0
            label[y, x] = n
            while stack:
                cy, cx = stack.pop()
                count += 1
                for ny, nx in ((cy - 1, cx), (cy + 1, cx), (cy, cx - 1), (cy, cx + 1)):
                    if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not label[ny, nx]:
                        label[ny, nx] = n
                        stack.append((ny, nx))
            if count > best_size:
                best, best_size = n, count
    return label == best if best else np.zeros_like(mask)


def measure(component):
    """(fill, top, width, height) of a component mask; None when it is empty."""
    ys, xs = np.nonzero(component)
    if ys.size == 0:
        return None
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    h, w = y1 - y0, x1 - x0
    fill = ys.size / float(h * w)
    top = float((ys < y0 + h / 2.0).sum()) / ys.size
    return fill, top, int(w), int(h)


def kind_of(m, protos):
    if m is None:
        return None
    fill, top = m[0], m[1]
    return min(protos, key=lambda k: ((fill - protos[k][0]) / SPREAD["fill"]) ** 2 +
               ((top - protos[k][1]) / SPREAD["top"]) ** 2)


def prototypes():
    """Each kind's (fill, top), averaged over its drawn sizes and sub-pixel offsets."""
    protos = {}
    pal = {"white": shapes.COLOURS["white"], "black": shapes.COLOURS["black"]}
    rng = np.random.default_rng(0)
    for kind in shapes.KINDS:
        ms = []
        for size in shapes.SIZES:
            for _ in range(8):
                img = shapes.draw(("white", ((kind, "black", size, shapes.CENTER),)), rng)
                cls, names = classify(img, pal)
                ms.append(measure(largest_component(cls == names.index("black")))[:2])
        protos[kind] = [round(float(v), 3) for v in np.mean(ms, 0)]
    return protos


CHECKER = {"box": BOX, "margin": MARGIN, "foreground": FOREGROUND, "empty": EMPTY,
           "spread": SPREAD, "prototypes": prototypes()}


def check(img, scene, held):
    """The verdict on one picture (uint8 HxWx3) of one held-out scene (heldout.json's form):
    {"colour_place": bool, "kind": bool, "pass": bool, "detail": [...]}."""
    size, grid, chk = held["size"], held["grid"], held["checker"]
    cls, names = classify(img, held["palette"])
    bgi = names.index(scene["background"])
    box, cell = chk["box"], size / grid

    def box_colours(place):
        cy, cx = (place[0] + 0.5) * cell, (place[1] + 0.5) * cell
        y0, x0 = int(round(cy - box / 2)), int(round(cx - box / 2))
        b = cls[y0:y0 + box, x0:x0 + box].ravel()
        fg = b[b != bgi]
        frac = fg.size / b.size
        dom = names[np.bincount(fg, minlength=len(names)).argmax()] if fg.size else None
        return frac, dom

    def kind_in(place, colour):
        y0, y1, x0, x1 = cell_bounds(place, size, grid, chk["margin"])
        m = measure(largest_component(cls[y0:y1, x0:x1] == names.index(colour)))
        return kind_of(m, chk["prototypes"]), m

    places = [(s["row"], s["col"]) for s in scene["shapes"]]
    detail, colour_ok, kind_ok = [], True, True
    cells = [(r, c) for r in range(grid) for c in range(grid)]
    if scene.get("places_said", True):
        occupied = set(places)
        for s, place in zip(scene["shapes"], places):
            frac, dom = box_colours(place)
            good = frac >= chk["foreground"] and dom == s["colour"]
            kind, m = kind_in(place, s["colour"]) if good else (None, None)
            colour_ok &= good
            kind_ok &= kind == s["kind"]
            detail.append({"place": list(place), "colour": s["colour"], "dominant": dom,
                           "foreground": round(float(frac), 3), "kind": s["kind"],
                           "drawn": kind, "measures": m and [round(m[0], 3), round(m[1], 3)]})
    else:
        found = {}
        for place in cells:
            frac, dom = box_colours(place)
            if frac >= chk["foreground"]:
                found[place] = dom
        occupied = set(found)
        want = sorted(s["colour"] for s in scene["shapes"])
        got = sorted(found.values())
        colour_ok = want == got
        if not colour_ok:
            detail.append({"colours": want, "found": got})
        # Per colour, the kinds drawn in its cells, as a multiset, are the kinds asked for.
        for colour in set(want):
            asked = sorted(s["kind"] for s in scene["shapes"] if s["colour"] == colour)
            drawn = sorted(str(kind_in(place, c)[0]) for place, c in found.items()
                           if c == colour)
            if drawn != asked:
                kind_ok = False
                detail.append({"colour": colour, "kinds": asked, "drawn": drawn})
    for place in cells:
        if place in occupied:
            continue
        y0, y1, x0, x1 = cell_bounds(place, size, grid)
        frac = float((cls[y0:y1, x0:x1] == bgi).mean())
        if frac < chk["empty"]:
            colour_ok = False
            detail.append({"empty_place": list(place), "background": round(frac, 3)})
    kind_ok = bool(kind_ok and colour_ok)
    return {"colour_place": bool(colour_ok), "kind": kind_ok, "pass": kind_ok, "detail": detail}


def spread(items, count):
    """`count` of `items` spread evenly over the list; tests/test_tiny_shapes.cpp picks the same."""
    count = min(count, len(items))
    return [items[i * len(items) // count] for i in range(count)]


def generate(pipe, captions, max_seq, seeds, batch=16):
    import torch
    out = []
    for i in range(0, len(captions), batch):
        gens = [torch.Generator().manual_seed(s) for s in seeds[i:i + batch]]
        imgs = pipe(captions[i:i + batch], height=shapes.SIZE, width=shapes.SIZE,
                    num_inference_steps=STEPS, max_sequence_length=max_seq, guidance_scale=3.5,
                    generator=gens, output_type="np").images
        out += [(im * 255).round().clip(0, 255).astype(np.uint8) for im in imgs]
    return out


def score_sets(pipe, held, max_seq, count=None, preview=None):
    """Each set's rates: colour and place (or colour, places free), kind, and both; the first
    failures. The i-th scene of a set (after `spread`) is generated from seed i."""
    res, shown = {}, []
    for name, scenes in held["sets"].items():
        scenes = spread(scenes, count) if count else scenes
        imgs = generate(pipe, [s["caption"] for s in scenes], max_seq, list(range(len(scenes))))
        verdicts = [check(im, s, held) for im, s in zip(imgs, scenes)]
        n = len(scenes)
        res[name] = {"scenes": n,
                     "colour_place": sum(v["colour_place"] for v in verdicts) / n,
                     "kind": sum(v["kind"] for v in verdicts) / n,
                     "first_failures": [{"caption": s["caption"], "detail": v["detail"]}
                                        for s, v in zip(scenes, verdicts)
                                        if not v["pass"]][:6]}
        shown += list(zip(imgs[:4], [s["caption"] for s in scenes[:4]]))
    if preview is not None:
        from PIL import Image
        rows = [np.concatenate([im for im, _ in shown[r:r + 4]], 1)
                for r in range(0, len(shown) - len(shown) % 4, 4)]
        Image.fromarray(np.concatenate(rows, 0)).save(preview)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", required=True, type=Path)
    ap.add_argument("--heldout", type=Path,
                    default=Path(__file__).resolve().parent / "heldout.json")
    ap.add_argument("--count", type=int, default=0, help="scenes per set, spread (0: all)")
    ap.add_argument("--preview", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    from diffusers import FluxPipeline
    torch.set_num_threads(args.threads)
    held = json.loads(args.heldout.read_text())
    pipe = FluxPipeline.from_pretrained(args.pipeline, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    print(json.dumps(score_sets(pipe, held, held["max_sequence_length"], args.count or None,
                                args.preview), indent=1))


if __name__ == "__main__":
    main()
