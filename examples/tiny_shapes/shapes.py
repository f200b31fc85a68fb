"""The tiny-shapes data set: captioned pictures of one to three coloured shapes, drawn here.

A scene is a background colour and one to three shapes, each a (kind, colour, size, place) with
the places distinct. Pictures are 128x128, the nine places are the cells of a 3x3 grid, and the
caption names everything: "a large red circle at the top left and a small blue square in the
center on a white background". Some single-shape scenes are held out of training (seeded, see
`held_out`); tests/test_tiny_shapes.cpp generates them and checks the colours where the caption
says. Deterministic: everything is drawn from a numpy Generator seeded by the caller.
"""

import itertools

import numpy as np
from PIL import Image, ImageDraw

SIZE = 128
# Well separated in RGB, so a pixel's nearest palette colour names it without doubt.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 50, 180),
    "orange": (245, 130, 20),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
KINDS = ["circle", "square", "triangle"]
SIZES = {"small": 11, "large": 19}  # half extent in pixels
# (row, column) of the 3x3 grid -> the words of the caption.
PLACES = {
    (0, 0): "at the top left",
    (0, 1): "at the top",
    (0, 2): "at the top right",
    (1, 0): "on the left",
    (1, 1): "in the center",
    (1, 2): "on the right",
    (2, 0): "at the bottom left",
    (2, 1): "at the bottom",
    (2, 2): "at the bottom right",
}
PLACE_NAMES = {v: k for k, v in PLACES.items()}
CELL = SIZE / 3.0
JITTER = 4  # pixels of random offset of a shape's center inside its cell


def cell_center(place):
    row, col = place
    return ((col + 0.5) * CELL, (row + 0.5) * CELL)


def caption(scene):
    bg, shapes = scene
    parts = [f"a {size} {colour} {kind} {PLACES[place]}" for kind, colour, size, place in shapes]
    return " and ".join(parts) + f" on a {bg} background"


def draw(scene, rng):
    """The picture of a scene (uint8 HxWx3), with the shapes' centers jittered by rng."""
    bg, shapes = scene
    img = Image.new("RGB", (SIZE, SIZE), COLOURS[bg])
    d = ImageDraw.Draw(img)
    for kind, colour, size, place in shapes:
        cx, cy = cell_center(place)
        cx += rng.uniform(-JITTER, JITTER)
        cy += rng.uniform(-JITTER, JITTER)
        r = SIZES[size]
        fill = COLOURS[colour]
        if kind == "circle":
            d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        elif kind == "square":
            s = r * 0.9
            d.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
        else:
            d.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=fill)
    return np.asarray(img)


def single_scenes():
    """Every one-shape scene (the shape's colour differs from the background)."""
    out = []
    for bg, kind, colour, size, place in itertools.product(COLOURS, KINDS, COLOURS, SIZES,
                                                           PLACES):
        if colour != bg:
            out.append((bg, ((kind, colour, size, place),)))
    return out


def held_out(seed, count):
    """`count` one-shape scenes never shown in training, chosen from `seed`."""
    scenes = single_scenes()
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(scenes), size=count, replace=False)
    return [scenes[i] for i in sorted(idx)]


def random_scene(rng, excluded):
    """A scene of one to three shapes at distinct places; none of its shapes, with its
    background, is a held-out one-shape scene (so no held-out scene is seen even in part)."""
    colours = list(COLOURS)
    places = list(PLACES)
    while True:
        n = int(rng.choice([1, 2, 3], p=[0.5, 0.3, 0.2]))
        bg = colours[rng.integers(len(colours))]
        chosen = rng.choice(len(places), size=n, replace=False)
        shapes = []
        for p in chosen:
            colour = bg
            while colour == bg:
                colour = colours[rng.integers(len(colours))]
            shapes.append((KINDS[rng.integers(len(KINDS))], colour,
                           list(SIZES)[rng.integers(len(SIZES))], places[p]))
        # Row-major order of places in the caption: one caption per scene.
        shapes.sort(key=lambda s: s[3])
        scene = (bg, tuple(shapes))
        if any((bg, (s,)) in excluded for s in shapes):
            continue
        return scene


def vocabulary():
    """Every word a caption can hold."""
    words = {"a", "and", "on", "background", "at", "the", "in", "center"}
    words.update(COLOURS)
    words.update(KINDS)
    words.update(SIZES)
    for p in PLACES.values():
        words.update(p.split())
    return sorted(words)


def write_held_out(path, scenes, box, steps):
    """heldout.json: the scenes (caption, background, shapes with grid row/col) and what the
    checker needs (palette, picture size, grid, the central box checked in a shape's cell, the
    number of steps the pictures are made with)."""
    import json
    doc = {
        "size": SIZE, "grid": 3, "box": box, "num_inference_steps": steps,
        "palette": {k: list(v) for k, v in COLOURS.items()},
        "scenes": [{"caption": caption(s), "background": s[0],
                    "shapes": [{"kind": k, "colour": c, "size": z, "row": p[0], "col": p[1]}
                               for k, c, z, p in s[1]]} for s in scenes],
    }
    with open(path, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
