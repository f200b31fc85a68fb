"""Trains tiny-shapes: a FLUX.1-architecture diffusers pipeline that draws the shapes a caption
asks for, the caption written as a person would write it.

    python3 -m venv V && V/bin/pip install -r tests/fixtures/requirements.txt
    V/bin/python examples/tiny_shapes/train.py --out models/flux/tiny_shapes --state /tmp/ts

Writes a normal FluxPipeline folder (model_index.json, scheduler/, tokenizer/ (CLIP byte-level
BPE whose merges make every known caption word one token), tokenizer_2/ (a SentencePiece unigram
model holding every known caption word as one piece), text_encoder/ (CLIPTextModel),
text_encoder_2/ (T5EncoderModel), transformer/ (FluxTransformer2DModel), vae/ (AutoencoderKL,
4x down)) that diffusers and xfuser both load unchanged, plus heldout.json (the held-out sets of
shapes.held_out_sets, for score.py and tests/test_tiny_shapes.cpp) and train_log.json (losses,
times, the held-out scores measured here with diffusers' FluxPipeline).

What is trained, in order (deterministic from --seed on a fixed thread count):
  1. the VAE, on 48x48 crops of drawn pictures around a shape (it is fully convolutional): L1
     of the decoded latent mean plus noise of std --vae_noise, the L1 of the pictures' gradients
     (edges stay sharp: the shapes' kinds are in their corners), both weighted up on and near the
     shapes (`focus`), and a small L2 on the latents; then
     shift_factor and scaling_factor are set from the latents' mean and std, as FLUX.1's;
  2. a fixed set of pictures is encoded once, each with --captions captions drawn from
     shapes.training_caption (phrasings, orders, left-out parts, fillers, made-up words);
  2b. T5, CLIP and an auxiliary scene parser (`Parser`, not part of the pipeline) alone, on
     fresh captions: the parser reads T5's tokens and CLIP's pooled vector and says the
     background, each colour's count and each cell's colour, kind and size, so that the text
     encoders can read a caption before the transformer needs them to;
  3. the transformer from seeded random weights, T5 and CLIP from phase 2b, by rectified flow (the
     pipeline's velocity: noise - x0, at sigmas drawn logit-normal and shifted as the pipeline's
     schedule is at this size), with an EMA of the weights, which is what is saved. FLUX gives
     text tokens no position (txt_ids are zero), so which colour word belongs to which shape,
     place or the background must come from the text encoders (phase 2b). The guidance
     embedding's output is held at zero: this model has no distilled guidance. The parser's loss
     (--parse_weight) keeps reaching the text encoders;
  4. the VAE's decoder alone, on whole pictures, from the stored VAE (the encoder and so the
     latent space stay as the transformer learned them).

--state keeps what each phase made (the VAE, the encoded set, phase 3's weights, EMA, optimizer
and random state every --checkpoint_every steps): a run stopped anywhere resumes there with the
same command. Phase 3 writes the model at step --finish_at of a learning-rate schedule spanning
--steps; a larger --finish_at (up to --steps) goes on from the same state, and so does a larger
--steps, though the schedule then changes, so that run is not the run made at once with that
--steps. train_log.json records every stretch.

--init_from FOLDER starts a fresh --state from a pipeline folder this script wrote (the committed
models/flux/tiny_shapes), for going on where a run's state is gone: the tokenizers are made again
and must equal the folder's, the VAE is the folder's (so the latent space, its shift and scale
too), the pictures are encoded again, the parser learns to read the folder's text encoders (held
frozen) for --text_steps, and phase 3 goes on from the folder's transformer, T5 and CLIP with a
fresh optimizer and schedule.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes  # noqa: E402

CLIP_MAX = 77
T5_PIECES = 256


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- tokenizers
def bytes_to_unicode():
    """CLIP's (GPT-2's) byte-to-symbol map: printable bytes map to themselves, the others to
    code points from 256 up, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def write_clip_tokenizer(out, words):
    """CLIP's layout: the 256 byte symbols, the same with </w>, one entry per merge, then
    <|startoftext|> and <|endoftext|>. Merges: the most frequent adjacent pair over the words
    (ties: the smallest pair), until every word is one symbol."""
    b2u = bytes_to_unicode()
    seqs = {w: [b2u[b] for b in w.encode()] for w in words}
    for w in seqs:
        seqs[w][-1] += "</w>"
    merges = []
    while any(len(s) > 1 for s in seqs.values()):
        counts = {}
        for s in seqs.values():
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        for w, s in seqs.items():
            i, n = 0, []
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    n.append(s[i] + s[i + 1])
                    i += 2
                else:
                    n.append(s[i])
                    i += 1
            seqs[w] = n
    symbols = list(b2u.values())
    vocab = symbols + [s + "</w>" for s in symbols] + [a + b for a, b in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out.mkdir(parents=True)
    (out / "vocab.json").write_text(json.dumps({v: i for i, v in enumerate(vocab)}) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer", "model_max_length": CLIP_MAX,
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, indent=2) + "\n")
    return len(vocab)


def strip_paths(model_file):
    """Drops the training input and output paths SentencePiece records in the model, so a rerun
    elsewhere writes the same bytes (they do not change tokenization)."""
    # transformers' own copy of the proto module: importing sentencepiece's as well registers
    # sentencepiece_model.proto twice, and T5TokenizerFast's conversion then fails.
    from transformers.convert_slow_tokenizer import import_protobuf
    m = import_protobuf().ModelProto()
    m.ParseFromString(model_file.read_bytes())
    m.trainer_spec.ClearField("input")
    m.trainer_spec.ClearField("model_prefix")
    model_file.write_bytes(m.SerializeToString())


def whole_words(model_file, words):
    """Makes each known caption word one piece of the unigram model: a word the trainer left
    split (a rare one, such as "against") gets its piece, and every word piece a log-probability
    of at least -3, above any split of it into two or more of the other pieces."""
    from transformers.convert_slow_tokenizer import import_protobuf
    m = import_protobuf().ModelProto()
    m.ParseFromString(model_file.read_bytes())
    index = {p.piece: p for p in m.pieces}
    for w in words:
        if not w.isalpha():
            continue
        piece = index.get("\u2581" + w)
        if piece is None:
            piece = m.pieces.add()
            piece.piece = "\u2581" + w
            piece.score = -3.0
            piece.type = 1  # NORMAL
        piece.score = max(piece.score, -3.0)
    model_file.write_bytes(m.SerializeToString())


def write_t5_tokenizer(out, corpus, words):
    """A SentencePiece unigram model: the caption words as whole pieces (checked by the caller),
    letters and word parts for the rest. Unigram, not BPE: transformers' T5 tokenizers (the
    fast one, and every T5Tokenizer of transformers 5) rebuild a unigram model from the pieces'
    scores, which splits a BPE model's words differently from SentencePiece (and so from xfuser
    and transformers 4's slow T5Tokenizer); on a unigram model all of them agree."""
    import sentencepiece as spm
    out.mkdir(parents=True)
    text = out / ".corpus.txt"
    text.write_text("\n".join(corpus) + "\n")
    # T5's id layout: <pad> 0, </s> 1, <unk> 2, no BOS.
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "spiece"), vocab_size=T5_PIECES, model_type="unigram",
        hard_vocab_limit=False, character_coverage=1.0, num_threads=1, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        minloglevel=2, user_defined_symbols=[], split_digits=False)
    text.unlink()
    (out / "spiece.vocab").unlink()
    strip_paths(out / "spiece.model")
    whole_words(out / "spiece.model", words)
    (out / "special_tokens_map.json").write_text(json.dumps({
        "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "T5Tokenizer", "model_max_length": 512, "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "extra_ids": 0}, indent=2) + "\n")
    sp = spm.SentencePieceProcessor(model_file=str(out / "spiece.model"))
    return sp


# ---------------------------------------------------------------- data
def to_tensor(imgs):
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def pack(z):
    b, c, h, w = z.shape
    z = z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return z.reshape(b, (h // 2) * (w // 2), c * 4)


def flux_ids(max_seq, vae_scale):
    """FluxPipeline's img_ids for the packed latent grid of a SIZE x SIZE picture, its zero
    txt_ids, and its schedule's mu at this size (sigma' = e^mu s / (1 + (e^mu - 1) s))."""
    hl = shapes.SIZE // vae_scale // 2
    img_ids = torch.zeros(hl, hl, 3)
    img_ids[..., 1] = torch.arange(hl)[:, None]
    img_ids[..., 2] = torch.arange(hl)[None, :]
    m = (1.15 - 0.5) / (4096 - 256)
    return img_ids.reshape(-1, 3), torch.zeros(max_seq, 3), hl * hl * m + (0.5 - m * 256)


def flow_batch(n_pictures, n_captions, x0_all, batch, mu, g):
    """One rectified-flow batch: picture indices, caption indices (one of each picture's),
    x0, noise, sigmas (logit-normal, shifted by mu), guidance values (uniform 1..5; the guidance
    embedding is held at zero, so they change nothing) and x_t."""
    idx = torch.randint(0, n_pictures, (batch,), generator=g)
    cap = idx * n_captions + torch.randint(0, n_captions, (batch,), generator=g)
    x0 = x0_all[idx]
    noise = torch.randn(x0.shape, generator=g)
    s = torch.sigmoid(torch.randn(batch, generator=g))
    s = math.exp(mu) * s / (1 + (math.exp(mu) - 1) * s)
    guidance = 1.0 + 4.0 * torch.rand(batch, generator=g)
    xt = (1 - s[:, None, None]) * x0 + s[:, None, None] * noise
    return idx, cap, x0, noise, s, guidance, xt


def encode_pictures(vae, n, n_captions, rng, excluded, excluded_multi):
    """n fresh scenes drawn from rng (none held out), VAE-encoded (latent mode) in batches of
    64, each with n_captions captions: (raw latents, captions, the last batch's pixels, the
    specs). Without a VAE, the same draws from rng and no latents (the specs of a set encoded
    before, from the same rng)."""
    caps, lat, all_specs, masks = [], [], [], []
    with torch.no_grad():
        for i in range(0, n, 64):
            specs = [shapes.random_spec(rng, excluded, excluded_multi)
                     for _ in range(min(64, n - i))]
            imgs = [shapes.draw(sp.scene, rng) for sp in specs]
            x = to_tensor(imgs)
            masks += [shape_tokens(img, sp.scene[0]) for img, sp in zip(imgs, specs)]
            if vae is not None:
                lat.append(vae.encode(x).latent_dist.mode())
            for sp in specs:
                caps += [shapes.training_caption(sp, rng) for _ in range(n_captions)]
            all_specs += specs
    return (torch.cat(lat) if lat else None), caps, x, all_specs, torch.stack(masks)


def shape_tokens(img, bg, token=8):
    """Which packed latent tokens (token x token pixels each: 4x VAE, 2x2 packing) hold a shape's
    pixel: bool [tokens]."""
    m = torch.from_numpy((img != np.array(shapes.COLOURS[bg], dtype=np.uint8)).any(-1))
    t = shapes.SIZE // token
    return m.view(t, token, t, token).any(3).any(1).reshape(-1)


def parse_targets(specs, n_captions):
    """What each caption says, as the auxiliary parser's targets (one row per caption): the
    background colour; each colour's number of shapes (0-3); and, where the caption says the
    places, each of the nine cells' colour, kind and size (the last class of each: empty)."""
    colours, sizes = list(shapes.COLOURS), list(shapes.SIZES)
    bg = torch.zeros(len(specs), dtype=torch.long)
    bag = torch.zeros(len(specs), len(colours), dtype=torch.long)
    cells = torch.zeros(len(specs), 9, 3, dtype=torch.long)
    cells[:, :, 0], cells[:, :, 1], cells[:, :, 2] = len(colours), len(shapes.KINDS), len(sizes)
    said = torch.zeros(len(specs))
    for i, sp in enumerate(specs):
        b, items = sp.scene
        bg[i] = colours.index(b)
        said[i] = float(sp.say_places)
        for kind, colour, size, (r, c) in items:
            bag[i, colours.index(colour)] += 1
            cells[i, r * 3 + c] = torch.tensor([colours.index(colour), shapes.KINDS.index(kind),
                                                sizes.index(size)])
    rep = lambda t: t.repeat_interleave(n_captions, 0)  # noqa: E731
    return {"bg": rep(bg), "bag": rep(bag), "cells": rep(cells), "said": rep(said)}


class Parser(torch.nn.Module):
    """The auxiliary scene parser trained on the text encoders' outputs in phase 3 (not part of
    the pipeline): from T5's tokens, the background colour and each colour's count (a masked
    mean over the caption's tokens) and each cell's colour, kind and size (nine learned queries
    attending over the tokens); from CLIP's pooled vector, the background colour and the counts.
    Its loss teaches T5 to bind each colour, size and place to its shape, which FLUX's
    position-free text tokens need and the diffusion loss alone teaches slowly."""

    def __init__(self, width, clip_width):
        super().__init__()
        n = len(shapes.COLOURS)
        self.bg = torch.nn.Linear(width, n)
        self.bag = torch.nn.Linear(width, n * 4)
        self.clip_bg = torch.nn.Linear(clip_width, n)
        self.clip_bag = torch.nn.Linear(clip_width, n * 4)
        self.queries = torch.nn.Parameter(torch.randn(9, width) / width ** 0.5)
        self.cell = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                        torch.nn.Linear(width, (n + 1) + 4 + 4))

    def heads(self, hidden, mask, pooled):
        """The parser's logits: background and counts from T5's masked mean and from CLIP's
        pooled vector, and the nine cells' colour, kind and size from T5's tokens."""
        n = len(shapes.COLOURS)
        m = mask[..., None].float()
        mean = (hidden * m).sum(1) / m.sum(1)
        att = torch.einsum("qd,bld->bql", self.queries, hidden) / hidden.shape[-1] ** 0.5
        att = att.masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
        cell = self.cell(torch.einsum("bql,bld->bqd", att, hidden))
        return {"bg": self.bg(mean), "bag": self.bag(mean).view(-1, n, 4).transpose(1, 2),
                "clip_bg": self.clip_bg(pooled),
                "clip_bag": self.clip_bag(pooled).view(-1, n, 4).transpose(1, 2),
                "colour": cell[..., :n + 1], "kind": cell[..., n + 1:n + 5],
                "size": cell[..., n + 5:]}

    def loss(self, hidden, mask, pooled, t):
        o = self.heads(hidden, mask, pooled)
        ce = F.cross_entropy
        loss = ce(o["bg"], t["bg"]) + ce(o["bag"], t["bag"]) + ce(o["clip_bg"], t["bg"]) + \
            ce(o["clip_bag"], t["bag"])
        said = t["said"]
        if said.sum() > 0:
            cells = t["cells"]
            per = sum(F.cross_entropy(o[k].reshape(-1, o[k].shape[-1]), cells[..., i].reshape(-1),
                                      reduction="none").view(-1, 9).mean(1)
                      for i, k in enumerate(("colour", "kind", "size")))
            loss = loss + (per * said).sum() / said.sum()
        return loss

    @torch.no_grad()
    def accuracy(self, hidden, mask, pooled, t):
        """How often the parser reads the caption right: the background (T5 and CLIP), every
        colour's count, and, over the occupied cells of captions that say their places, each
        cell's colour, kind and size."""
        o = self.heads(hidden, mask, pooled)
        hit = lambda k, target: (o[k].argmax(-1) == target).float().mean().item()  # noqa: E731
        said = t["said"] > 0
        cells = t["cells"]
        occ = (cells[..., 0] < len(shapes.COLOURS)) & said[:, None]
        acc = {"bg": hit("bg", t["bg"]), "clip_bg": hit("clip_bg", t["bg"]),
               "counts": (o["bag"].argmax(1) == t["bag"]).all(1).float().mean().item()}
        for i, k in enumerate(("colour", "kind", "size")):
            acc[k] = (o[k].argmax(-1)[occ] == cells[..., i][occ]).float().mean().item() \
                if occ.any() else float("nan")
        return acc


def save_pairs(pair, path):
    """Rows of [picture | its VAE round trip] ([B, 3, H, 2W] in -1..1) as one PNG."""
    from PIL import Image
    Image.fromarray(pair.clamp(-1, 1).add(1).mul(127.5).round().byte().permute(0, 2, 3, 1)
                    .reshape(-1, 2 * shapes.SIZE, 3).numpy()).save(path)


def focus(x, bg):
    """Per-pixel loss weights: 1 on the background, 5 on and within 2 pixels of a shape, so the
    few shape pixels of a picture (whose corners tell the kinds apart) are not drowned by the
    flat background, which a blurry reconstruction already gets right."""
    shape = ((x - bg[:, :, None, None]).abs().amax(1, keepdim=True) > 0.05).float()
    return 1.0 + 4.0 * F.max_pool2d(shape, 5, stride=1, padding=2)


def vae_loss(vae, x, bg, noise, decoder_only=False):
    """Focus-weighted L1 of the round trip, focus-weighted L1 of its gradients (edges stay
    sharp), and the latent mean (for the caller's small L2)."""
    if decoder_only:
        with torch.no_grad():
            mean = vae.encode(x).latent_dist.mean
    else:
        mean = vae.encode(x).latent_dist.mean
    rec = vae.decode(mean + noise * torch.randn_like(mean)).sample
    w = focus(x, bg)
    l1 = ((rec - x).abs() * w).mean() / w.mean()
    gy = ((rec[:, :, 1:] - rec[:, :, :-1]) - (x[:, :, 1:] - x[:, :, :-1])).abs() * w[:, :, 1:]
    gx = ((rec[..., 1:] - rec[..., :-1]) - (x[..., 1:] - x[..., :-1])).abs() * w[..., 1:]
    return l1, (gy.mean() + gx.mean()) / w.mean(), mean


def vae_batch(rng, n, excluded, excluded_multi, crop):
    """n training pictures (and their background colours, -1..1), each cropped to crop x crop
    around one of its shapes (a random offset of up to a quarter crop), or whole when crop is
    the picture's size."""
    xs, bgs = [], []
    for _ in range(n):
        spec = shapes.random_spec(rng, excluded, excluded_multi)
        img = shapes.draw(spec.scene, rng)
        if crop < shapes.SIZE:
            _, _, _, place = spec.scene[1][int(rng.integers(len(spec.scene[1])))]
            cx, cy = shapes.cell_center(place)
            q = crop // 4
            oy = int(np.clip(cy - crop / 2 + rng.integers(-q, q + 1), 0, shapes.SIZE - crop))
            ox = int(np.clip(cx - crop / 2 + rng.integers(-q, q + 1), 0, shapes.SIZE - crop))
            img = img[oy:oy + crop, ox:ox + crop]
        xs.append(img)
        bgs.append(shapes.COLOURS[spec.scene[0]])
    return to_tensor(xs), torch.tensor(bgs, dtype=torch.float32) / 127.5 - 1.0


# ---------------------------------------------------------------- main
def make_tokenizers(folder, seed):
    """tokenizer/ and tokenizer_2/ in `folder` from the training distribution's captions and the
    held-out ones (their real English unknown words get letter pieces, as any text does);
    checked: every known word is one token of each, and transformers' T5 tokenizer splits every
    caption as SentencePiece does. Returns the T5 sequence length (the longest caption, + </s>,
    rounded up to 8)."""
    rng = np.random.default_rng(seed + 10)
    _, _, sets = shapes.held_out_sets()
    words = shapes.vocabulary()
    clip_vocab = write_clip_tokenizer(folder / "tokenizer", words)
    corpus = [shapes.training_caption(shapes.random_spec(rng), rng) for _ in range(20000)]
    sp = write_t5_tokenizer(folder / "tokenizer_2", corpus, words)
    for w in words:
        if w in (",", "-"):
            continue
        pieces = sp.encode(w, out_type=str)
        assert pieces == ["▁" + w], f"T5 tokenizer splits {w!r}: {pieces}"
    held = [c for items in sets.values() for _, c in items]
    longest = max(len(sp.encode(c)) for c in corpus + held) + 1
    from transformers import CLIPTokenizer, T5TokenizerFast
    tok1 = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    tok2 = T5TokenizerFast.from_pretrained(folder / "tokenizer_2")
    for c in corpus[:2000] + held:
        assert tok2(c).input_ids == sp.encode(c) + [1], f"T5TokenizerFast differs on {c!r}"
    for w in words:
        assert len(tok1(w).input_ids) == 3, f"CLIP tokenizer splits {w!r}"
    max_seq = int(math.ceil(longest / 8) * 8)
    log(f"tokenizers: CLIP {clip_vocab} entries, T5 {sp.get_piece_size()} pieces, "
        f"longest caption {longest} T5 tokens -> max_sequence_length {max_seq}")
    return clip_vocab, sp.get_piece_size(), max_seq


def train_vae(args, excluded, excluded_multi):
    """Phase 1."""
    from diffusers import AutoencoderKL
    torch.manual_seed(args.seed + 3)
    rng = np.random.default_rng(args.seed + 3)
    # One group in every GroupNorm: with several, a flat colour (most of every picture here)
    # normalises to the same features whatever the colour, and the VAE cannot learn the colours.
    # Three blocks: 4x down. At 8x a VAE of this size drew every shape as a blob.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 32, 64),
        layers_per_block=1, act_fn="silu", latent_channels=8, norm_num_groups=1,
        sample_size=shapes.SIZE, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=True, force_upcast=True)
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    vae.train()
    t0 = time.time()
    losses = []
    for step in range(args.vae_steps):
        x, bg = vae_batch(rng, 16, excluded, excluded_multi, 48)
        l1, ge, mean = vae_loss(vae, x, bg, args.vae_noise)
        loss = l1 + ge + 1e-3 * mean.pow(2).mean()
        lr = args.vae_lr * min(1.0, (step + 1) / 100) * (
            0.5 + 0.5 * math.cos(math.pi * step / args.vae_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(l1.item())
        if step % 100 == 0 or step == args.vae_steps - 1:
            log(f"vae {step}: L1 {np.mean(losses[-100:]):.4f} edges {ge.item():.4f} "
                f"({time.time() - t0:.0f} s)")
    vae.eval()
    return vae, {"steps": args.vae_steps, "final_l1": float(np.mean(losses[-100:])),
                 "seconds": time.time() - t0}


def load_tokenizers(state):
    """The CLIP and T5 tokenizers phase 0 wrote into state."""
    from transformers import CLIPTokenizer, T5TokenizerFast
    return (CLIPTokenizer.from_pretrained(state / "tokenizer"),
            T5TokenizerFast.from_pretrained(state / "tokenizer_2"))


def token_ids(tokenizers, caps, max_seq):
    """The captions' CLIP ids (padded to CLIP_MAX) and T5 ids (padded to max_seq)."""
    tok1, tok2 = tokenizers
    ids1 = tok1(caps, padding="max_length", max_length=CLIP_MAX, truncation=True,
                return_tensors="pt").input_ids
    ids2 = tok2(caps, padding="max_length", max_length=max_seq, truncation=True,
                return_tensors="pt").input_ids
    return ids1, ids2


def train_text(args, t5, clip, parser, tokenizers, max_seq, excluded, excluded_multi, ckpt):
    """2b. T5, CLIP and the parser alone, on fresh captions (no pictures): the text encoders
    learn to read each shape's colour, kind, size and place before the transformer needs them.
    Trained with the diffusion loss alone, T5 stays near chance on which cell holds which colour
    for thousands of steps, and the transformer then learns to take the layout from the noise.
    Resumes from ckpt."""
    params = [p for m in (t5, clip, parser) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=args.text_pre_lr, weight_decay=0.0, betas=(0.9, 0.99))
    rng = np.random.default_rng(args.seed + 9)
    start, seconds, history = 0, 0.0, []
    if ckpt.exists():
        c = torch.load(ckpt, weights_only=False)
        for m, sd in zip((t5, clip, parser), c["weights"]):
            m.load_state_dict(sd)
        opt.load_state_dict(c["opt"])
        rng.bit_generator.state = c["rng"]
        start, seconds, history = c["step"], c["seconds"], c["history"]
        log(f"text phase resumes at step {start}")
    t0 = time.time() - seconds
    losses = []

    def batch(n):
        specs = [shapes.random_spec(rng, excluded, excluded_multi) for _ in range(n)]
        caps = [shapes.training_caption(sp, rng) for sp in specs]
        return (*token_ids(tokenizers, caps, max_seq), parse_targets(specs, 1))

    for step in range(start, args.text_steps):
        ids1, ids2, t = batch(args.text_batch)
        loss = parser.loss(t5(ids2)[0], ids2 != 0, clip(ids1).pooler_output, t)
        warm = min(1.0, (step + 1) / 100)
        cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.text_steps))
        for grp in opt.param_groups:
            grp["lr"] = args.text_pre_lr * warm * cos
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        done = step + 1
        if done % 250 == 0 or done == args.text_steps:
            ids1, ids2, t = batch(256)
            with torch.no_grad():
                acc = parser.accuracy(t5(ids2)[0], ids2 != 0, clip(ids1).pooler_output, t)
            history.append({"step": done, "loss": float(np.mean(losses[-250:])),
                            **{k: round(v, 3) for k, v in acc.items()}})
            log(f"text {done}: loss {history[-1]['loss']:.3f} " +
                " ".join(f"{k} {v:.2f}" for k, v in acc.items()) +
                f" ({time.time() - t0:.0f} s)")
            torch.save({"weights": [m.state_dict() for m in (t5, clip, parser)],
                        "opt": opt.state_dict(), "rng": rng.bit_generator.state, "step": done,
                        "seconds": time.time() - t0, "history": history},
                       ckpt.with_suffix(".tmp"))
            os.rename(ckpt.with_suffix(".tmp"), ckpt)
    c = torch.load(ckpt, weights_only=False)
    return {"steps": c["step"], "batch": args.text_batch, "seconds": c["seconds"],
            "history": c["history"]}


def build_models(args, clip_vocab, t5_pieces, in_channels):
    from diffusers import FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    torch.manual_seed(args.seed + 1)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=clip_vocab, hidden_size=64, intermediate_size=128, projection_dim=64,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=CLIP_MAX,
        hidden_act="quick_gelu", bos_token_id=clip_vocab - 2, eos_token_id=clip_vocab - 1,
        pad_token_id=clip_vocab - 1))
    torch.manual_seed(args.seed + 2)
    t5 = T5EncoderModel(T5Config(
        vocab_size=t5_pieces, d_model=args.text_width, d_kv=32, d_ff=2 * args.text_width,
        num_layers=args.text_layers, num_heads=args.text_width // 32,
        feed_forward_proj="gated-gelu", eos_token_id=1, pad_token_id=0,
        decoder_start_token_id=0, dropout_rate=0.0))
    torch.manual_seed(args.seed + 4)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, num_layers=args.double_blocks,
        num_single_layers=args.single_blocks, attention_head_dim=32,
        num_attention_heads=args.heads, joint_attention_dim=args.text_width,
        pooled_projection_dim=64, guidance_embeds=True, axes_dims_rope=(8, 12, 12))
    # The guidance embedding's output layer is zero and stays so: a guidance value adds nothing.
    guidance_out = model.time_text_embed.guidance_embedder.linear_2
    with torch.no_grad():
        guidance_out.weight.zero_()
        guidance_out.bias.zero_()
    guidance_out.requires_grad_(False)
    return model, t5, clip


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the pipeline folder to write")
    ap.add_argument("--state", required=True, type=Path,
                    help="what each phase made, for resuming (kept after the run)")
    ap.add_argument("--report_dir", type=Path, default=Path(__file__).resolve().parent,
                    help="where heldout.json, train_log.json and vae_reconstruction.png go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vae_steps", type=int, default=1600)
    ap.add_argument("--vae_lr", type=float, default=1.5e-3)
    ap.add_argument("--vae_noise", type=float, default=0.03)
    ap.add_argument("--train_pictures", type=int, default=16000)
    ap.add_argument("--captions", type=int, default=4, help="captions drawn per picture")
    ap.add_argument("--text_steps", type=int, default=4000,
                    help="phase 2b: T5, CLIP and the parser alone on fresh captions")
    ap.add_argument("--text_batch", type=int, default=64)
    ap.add_argument("--text_pre_lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=4000,
                    help="phase 3: the transformer and the text encoders together; the "
                         "learning rate's cosine spans these steps")
    ap.add_argument("--finish_at", type=int, default=3100,
                    help="the phase-3 step the model is written at (0: --steps)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--text_lr", type=float, default=1e-4, help="the text encoders' in phase 3")
    ap.add_argument("--text_width", type=int, default=128, help="T5's d_model")
    ap.add_argument("--text_layers", type=int, default=3, help="T5's layers")
    ap.add_argument("--double_blocks", type=int, default=2)
    ap.add_argument("--single_blocks", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4, help="of 32 channels")
    ap.add_argument("--parse_weight", type=float, default=0.1,
                    help="the auxiliary scene parser's loss weight (0: none)")
    ap.add_argument("--parse_from", type=int, default=0,
                    help="the phase-3 step the parser's loss starts at")
    ap.add_argument("--focus_weight", type=float, default=0.0,
                    help="phase 3: extra loss weight of the tokens holding a shape")
    ap.add_argument("--focus_from", type=int, default=0,
                    help="the phase-3 step the token weights start at")
    ap.add_argument("--checkpoint_every", type=int, default=100)
    ap.add_argument("--stop_after", type=float, default=0,
                    help="minutes: save the state and stop once phase 3 has run this long")
    ap.add_argument("--decoder_steps", type=int, default=600,
                    help="phase 4: the decoder alone on whole pictures")
    ap.add_argument("--dtype", default="bfloat16", help="storage dtype of the transformer/VAE")
    ap.add_argument("--init_from", type=Path,
                    help="a pipeline folder this script wrote: a fresh --state goes on from it "
                         "(see above)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    state = args.state
    state.mkdir(parents=True, exist_ok=True)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    log_file = state / "train_log.json"
    train_log = json.loads(log_file.read_text()) if log_file.exists() else {
        "seed": args.seed, "threads": args.threads, "torch": torch.__version__}
    train_log.setdefault("runs", []).append({k: str(v) for k, v in vars(args).items()})
    excluded, excluded_multi, sets = shapes.held_out_sets()

    def save_log():
        log_file.write_text(json.dumps(train_log, indent=1) + "\n")

    # 0. Tokenizers.
    if "max_sequence_length" not in train_log:
        train_log["clip_vocab"], train_log["t5_pieces"], train_log["max_sequence_length"] = \
            make_tokenizers(state, args.seed)
        save_log()
    max_seq = train_log["max_sequence_length"]
    if args.init_from:
        for name in ("tokenizer/vocab.json", "tokenizer/merges.txt", "tokenizer_2/spiece.model"):
            assert (args.init_from / name).read_bytes() == (state / name).read_bytes(), \
                f"{args.init_from / name} is not the one this script makes"

    # 1. The VAE.
    from diffusers import AutoencoderKL
    if not (state / "vae").exists() and args.init_from:
        vae = AutoencoderKL.from_pretrained(args.init_from / "vae", torch_dtype=torch.float32)
        vae.save_pretrained(state / "vae.tmp")
        os.rename(state / "vae.tmp", state / "vae")
        train_log["vae"] = {"from": str(args.init_from), "seconds": 0.0}
        save_log()
    if not (state / "vae").exists():
        vae, train_log["vae"] = train_vae(args, excluded, excluded_multi)
        vae.save_pretrained(state / "vae.tmp")
        os.rename(state / "vae.tmp", state / "vae")
        save_log()
    vae = AutoencoderKL.from_pretrained(state / "vae", torch_dtype=torch.float32)
    vae_scale = 2 ** (len(vae.config.block_out_channels) - 1)

    # 2. The training set, encoded once.
    encoded = state / "encoded.pt"
    if not encoded.exists():
        t0 = time.time()
        rng = np.random.default_rng(args.seed + 5)
        lat, caps, x, specs, masks = encode_pictures(vae, args.train_pictures, args.captions,
                                                     rng, excluded, excluded_multi)
        shift = round(lat.mean().item(), 4)
        scale = round(1.0 / (lat - shift).std().item(), 4)
        if args.init_from:  # the latent space the folder's transformer was trained in
            shift, scale = vae.config.shift_factor, vae.config.scaling_factor
        lat = (lat - shift) * scale
        with torch.no_grad():
            pair = torch.cat([x[-8:], vae.decode(lat[-8:] / scale + shift).sample], 3)
        save_pairs(pair, args.report_dir / "vae_reconstruction.png")
        ids1, ids2 = token_ids(load_tokenizers(state), caps, max_seq)
        torch.save({"x0": pack(lat), "ids1": ids1, "ids2": ids2, "shift": shift, "scale": scale,
                    "captions": caps[:64], "targets": parse_targets(specs, args.captions),
                    "shape_tokens": masks},
                   state / "encoded.tmp")
        os.rename(state / "encoded.tmp", encoded)
        train_log["encode"] = {"pictures": args.train_pictures, "captions": len(caps),
                               "shift": shift, "scale": scale, "seconds": time.time() - t0}
        log(f"encoded {args.train_pictures} pictures, {len(caps)} captions: shift {shift}, "
            f"scale {scale} ({time.time() - t0:.0f} s)")
        save_log()
    data = torch.load(encoded)
    if "shape_tokens" not in data:  # a set encoded before these were kept: replayed
        _, caps, _, specs, masks = encode_pictures(None, args.train_pictures, args.captions,
                                                   np.random.default_rng(args.seed + 5),
                                                   excluded, excluded_multi)
        assert caps[:64] == data["captions"], "the replayed captions differ from the set's"
        data["targets"] = parse_targets(specs, args.captions)
        data["shape_tokens"] = masks
        torch.save(data, state / "encoded.tmp")
        os.rename(state / "encoded.tmp", encoded)
    x0_all, ids1_all, ids2_all = data["x0"], data["ids1"], data["ids2"]
    targets = data["targets"]
    n_pictures = x0_all.shape[0]
    n_captions = ids1_all.shape[0] // n_pictures

    # 3. The transformer, T5 and CLIP together.
    model, t5, clip = build_models(args, train_log["clip_vocab"], train_log["t5_pieces"],
                                   x0_all.shape[-1])
    modules = (model, t5, clip)
    trained = [[p for p in m.parameters() if p.requires_grad] for m in modules]
    base = [args.lr, args.text_lr, args.text_lr]
    opt = torch.optim.AdamW([{"params": ps, "lr": b} for ps, b in zip(trained, base)],
                            weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(args.seed + 6)
    torch.manual_seed(args.seed + 8)
    parser = Parser(args.text_width, clip.config.hidden_size)

    # 2b. The text encoders and the parser alone, before the transformer.
    ckpt = state / "phase3.pt"
    if args.init_from and not ckpt.exists():
        from diffusers import FluxTransformer2DModel
        from transformers import CLIPTextModel, T5EncoderModel
        for m, cls, sub in ((model, FluxTransformer2DModel, "transformer"),
                            (t5, T5EncoderModel, "text_encoder_2"),
                            (clip, CLIPTextModel, "text_encoder")):
            m.load_state_dict(cls.from_pretrained(args.init_from / sub,
                                                  torch_dtype=torch.float32).state_dict())
        # The folder holds no parser: it learns to read the folder's text encoders (frozen)
        # first, so that a random parser's gradients do not reach them.
        if args.text_steps:
            for m in (t5, clip):
                m.requires_grad_(False)
            train_log["text"] = train_text(args, t5, clip, parser, load_tokenizers(state),
                                           max_seq, excluded, excluded_multi, state / "text.pt")
            for m in (t5, clip):
                m.requires_grad_(True)
            save_log()
    elif args.text_steps and not ckpt.exists():
        tokenizers = load_tokenizers(state)
        for m in (t5, clip):
            m.train()
        train_log["text"] = train_text(args, t5, clip, parser, tokenizers, max_seq, excluded,
                                       excluded_multi, state / "text.pt")
        save_log()

    def add_parser():
        opt.add_param_group({"params": list(parser.parameters()), "lr": args.text_lr})
        base.append(args.text_lr)
    start, losses = 0, []
    if ckpt.exists():
        c = torch.load(ckpt)
        for m, sd in zip(modules, c["weights"]):
            m.load_state_dict(sd)
        if "parser" in c:
            parser.load_state_dict(c["parser"])
            add_parser()
        opt.load_state_dict(c["opt"])
        g.set_state(c["generator"])
        emas, start, losses = c["emas"], c["step"], c["losses"]
        log(f"phase 3 resumes at step {start}")
    else:
        emas = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
    parsing = args.parse_weight > 0
    if parsing and len(opt.param_groups) == 3:
        add_parser()
    parse_losses = []
    nparams = [sum(p.numel() for p in m.parameters()) for m in modules]
    log(f"transformer {nparams[0] / 1e6:.2f} M, T5 {nparams[1] / 1e6:.2f} M, "
        f"CLIP {nparams[2] / 1e6:.2f} M parameters")
    img_ids, txt_ids, mu = flux_ids(max_seq, vae_scale)

    def save_ckpt(step):
        torch.save({"weights": [m.state_dict() for m in modules], "emas": emas,
                    "opt": opt.state_dict(), "generator": g.get_state(), "step": step,
                    "losses": losses, **({"parser": parser.state_dict()} if parsing else {})},
                   state / "phase3.tmp")
        os.rename(state / "phase3.tmp", ckpt)

    t0 = time.time()
    for m in modules:
        m.train()
    step = start
    end = args.finish_at or args.steps
    while step < end:
        idx, cap, x0, noise, s, guidance, xt = flow_batch(n_pictures, n_captions, x0_all,
                                                          args.batch, mu, g)
        ids2 = ids2_all[cap]
        text = t5(ids2)[0]
        pooled = clip(ids1_all[cap]).pooler_output
        pred = model(hidden_states=xt, encoder_hidden_states=text, pooled_projections=pooled,
                     timestep=s, guidance=guidance, img_ids=img_ids, txt_ids=txt_ids,
                     return_dict=False)[0]
        if args.focus_weight and step >= args.focus_from:
            # Tokens holding a shape weigh 1 + focus_weight: a shape is 1-5% of a picture's
            # tokens, and the flat background alone otherwise sets most of the loss.
            w = 1.0 + args.focus_weight * data["shape_tokens"][idx].float()[..., None]
            loss = ((pred - (noise - x0)) ** 2 * w).mean() / w.mean()
        else:
            loss = F.mse_loss(pred, noise - x0)
        losses.append(loss.item())
        if parsing and step >= args.parse_from:
            parse = parser.loss(text, ids2 != 0, pooled, {k: v[cap] for k, v in targets.items()})
            parse_losses.append(parse.item())
            loss = loss + args.parse_weight * parse
        warm = min(1.0, (step + 1) / 200)
        cos = 0.55 + 0.45 * math.cos(math.pi * step / args.steps)
        for grp, b in zip(opt.param_groups, base):
            grp["lr"] = b * warm * cos
        opt.zero_grad()
        loss.backward()
        if parsing and step >= args.parse_from:
            # The parser's gradient reaches the text encoders alone; clipped apart, it does not
            # shrink the transformer's step.
            torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], 1.0)
            torch.nn.utils.clip_grad_norm_([p for grp in opt.param_groups[1:]
                                            for p in grp["params"]], 1.0)
        else:
            torch.nn.utils.clip_grad_norm_([p for grp in opt.param_groups
                                            for p in grp["params"]], 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema, m in zip(emas, modules):
                for k, v in m.state_dict().items():
                    ema[k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        step += 1
        if step % 100 == 0 or step == end:
            log(f"transformer {step}: loss {np.mean(losses[-100:]):.4f} "
                + (f"parse {np.mean(parse_losses[-100:]):.3f} " if parse_losses else "") +
                f"lr {args.lr * warm * cos:.2e} ({time.time() - t0:.0f} s)")
        if step % args.checkpoint_every == 0 or step == end:
            save_ckpt(step)
            if args.stop_after and time.time() - t0 > 60 * args.stop_after and step < end:
                train_log.setdefault("phase3_stretches", []).append(
                    {"from": start, "to": step, "seconds": time.time() - t0})
                save_log()
                log(f"stopped after step {step}; rerun the same command to go on")
                return
    if step > start:
        train_log.setdefault("phase3_stretches", []).append(
            {"from": start, "to": step, "seconds": time.time() - t0})
    train_log["transformer"] = {"parameters": nparams, "steps": step,
                                "final_loss": float(np.mean(losses[-200:]))}
    save_log()
    write_folder(args, modules, emas, vae, data, train_log)
    train_log["decoder"], pair = finetune_decoder(args.out, args.seed, args.decoder_steps,
                                                  excluded, excluded_multi,
                                                  getattr(torch, args.dtype))
    save_pairs(pair, args.report_dir / "vae_reconstruction.png")
    import score
    shapes.write_held_out(args.report_dir / "heldout.json", sets, score.CHECKER, score.STEPS,
                         max_seq)
    train_log["total_seconds"] = sum(train_log[k]["seconds"] for k in ("vae", "encode", "text",
                                                                       "decoder")
                                     if k in train_log) + \
        sum(s["seconds"] for s in train_log["phase3_stretches"])
    save_log()
    (args.report_dir / "train_log.json").write_text(json.dumps(train_log, indent=1) + "\n")
    log(f"trained in {train_log['total_seconds'] / 60:.1f} min")


def write_folder(args, modules, emas, vae, data, train_log):
    import shutil
    from diffusers import FlowMatchEulerDiscreteScheduler
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model, t5, clip = modules
    for ema, m in zip(emas, modules):
        m.load_state_dict(ema)
        m.eval()
    dtype = getattr(torch, args.dtype)
    model.to(dtype).save_pretrained(out / "transformer")
    clip.save_pretrained(out / "text_encoder")
    t5.save_pretrained(out / "text_encoder_2")
    shutil.copytree(args.state / "tokenizer", out / "tokenizer")
    shutil.copytree(args.state / "tokenizer_2", out / "tokenizer_2")
    vae.register_to_config(shift_factor=data["shift"], scaling_factor=data["scale"])
    vae.to(dtype).save_pretrained(out / "vae")
    FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
        shift=3.0, use_dynamic_shifting=True).save_pretrained(out / "scheduler")
    (out / "model_index.json").write_text(json.dumps({
        "_class_name": "FluxPipeline", "_diffusers_version": "0.33.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"]}, indent=2) + "\n")


def finetune_decoder(folder, seed, steps, excluded, excluded_multi, dtype):
    """4. The decoder alone, on whole pictures, from the VAE as stored. The encoder, hence the
    latent space and the transformer's targets, does not change; the decoder learns the whole
    picture's edges, which the 48x48 crops cut."""
    from diffusers import AutoencoderKL
    vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    torch.manual_seed(seed + 7)
    rng = np.random.default_rng(seed + 7)
    vae.requires_grad_(False)
    vae.decoder.requires_grad_(True)
    opt = torch.optim.AdamW(vae.decoder.parameters(), lr=5e-4, weight_decay=0.0)
    t0 = time.time()
    losses = []

    for step in range(steps):
        x, bg = vae_batch(rng, 8, excluded, excluded_multi, shapes.SIZE)
        l1, ge, _ = vae_loss(vae, x, bg, 0.03, decoder_only=True)
        for g in opt.param_groups:
            g["lr"] = 5e-4 * (0.5 + 0.5 * math.cos(math.pi * step / max(1, steps)))
        opt.zero_grad()
        (l1 + ge).backward()
        opt.step()
        losses.append(l1.item())
        if step % 100 == 0 or step == steps - 1:
            log(f"decoder {step}: L1 {np.mean(losses[-100:]):.4f} ({time.time() - t0:.0f} s)")
    vae.eval()
    with torch.no_grad():
        x, _ = vae_batch(rng, 8, excluded, excluded_multi, shapes.SIZE)
        pair = torch.cat([x, vae.decode(vae.encode(x).latent_dist.mean).sample], 3)
    vae.to(dtype).save_pretrained(folder / "vae")
    # diffusers records the folder the VAE was loaded from: a path of the training machine.
    config = json.loads((folder / "vae" / "config.json").read_text())
    config.pop("_name_or_path", None)
    (folder / "vae" / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {"steps": steps, "final_l1": float(np.mean(losses[-100:])) if losses else None,
            "seconds": time.time() - t0}, pair


if __name__ == "__main__":
    main()
