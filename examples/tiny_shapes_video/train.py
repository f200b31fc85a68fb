"""Trains tiny-shapes-video: a Wan 2.1-architecture diffusers pipeline that animates one shape
the way a caption says ("a red circle moves from left to right on a blue background", "a green
square falls", "a yellow triangle grows").

    python3 -m venv V && V/bin/pip install -r tests/fixtures/requirements-today.txt
    V/bin/python examples/tiny_shapes_video/train.py --out models/wan/tiny_shapes_video --state /tmp/tsv

Writes a normal WanPipeline folder (model_index.json, scheduler/ (UniPCMultistepScheduler, flow
prediction), tokenizer/ (a SentencePiece unigram model holding every known caption word as one
piece), text_encoder/ (UMT5EncoderModel), transformer/ (WanTransformer3DModel), vae/
(AutoencoderKLWan, 4x in space and in time)) that diffusers and xfuser both load unchanged, plus
heldout.json (world.held_out_sets, for score.py and the C++ test) and train_log.json (losses,
times, and the held-out scores measured with diffusers' WanPipeline).

What is trained, in order (deterministic from --seed on a fixed thread count):
  1. the VAE (causal 3D convolutions, as Wan's): first on single frames, then on --vae_window
     frame windows (its temporal layers), both as crops around the shape: focus-weighted L1 of
     the round trip decoded without diffusers' final clamp (a clamped output gives no gradient
     to a colour channel already past +-1), focus-weighted L1 of the gradients, a small L2 on
     the latents. latents_mean and latents_std are then set per channel from the encoded set;
  2. --train_clips clips, encoded once (the latent mean), each with --captions captions;
  3. UMT5 and an auxiliary caption parser (`Parser`, not part of the pipeline) alone, on fresh
     captions: the parser reads UMT5's tokens and says the background, the shape's colour and
     kind, and the motion, so the text encoder can read a caption before the transformer needs it;
  4. the transformer from seeded random weights by rectified flow as WanPipeline samples it: the
     velocity noise - x0 at sigmas drawn logit-normal and shifted by the scheduler's flow_shift,
     text as WanPipeline gives it (UMT5's states of the caption's tokens, zeros after), 10% of
     the captions empty (the pipeline's classifier-free guidance uses the empty caption), UMT5
     still learning with the parser's loss; an EMA of the weights is what is saved;
  5. the VAE's decoder alone on whole clips (the latent space stays as the transformer learned it).

--state keeps what each phase made (checkpoints every --checkpoint_every steps): a run stopped
anywhere resumes with the same command. train_log.json records every stretch and the total time.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import score  # noqa: E402
import world  # noqa: E402


def _tiny_shapes_train():
    """examples/tiny_shapes/train.py, whose tokenizer writer and log this script shares."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_shapes_train",
                                                  HERE.parent / "tiny_shapes" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TS = _tiny_shapes_train()
log, write_t5_tokenizer = _TS.log, _TS.write_t5_tokenizer

FLOW_SHIFT = 2.0
CROP = 32


# ---------------------------------------------------------------- data
def to_tensor(frames):
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in -1..1."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1


def focus(x, bg):
    """Per-pixel loss weights: 1 on the background, 5 on and within 2 pixels of the shape."""
    b, c, f, h, w = x.shape
    shape = ((x - bg[:, :, None, None, None]).abs().amax(1) > 0.05).float().view(b * f, 1, h, w)
    return (1.0 + 4.0 * F.max_pool2d(shape, 5, stride=1, padding=2)).view(b, 1, f, h, w)


def decode_raw(vae, z):
    """AutoencoderKLWan's decode without its final clamp to -1..1 (diffusers' _decode loop)."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    outs = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map,
                                feat_idx=vae._conv_idx, first_chunk=i == 0))
    vae.clear_cache()
    return torch.cat(outs, 2)


def vae_loss(vae, x, bg, noise, decoder_only=False):
    if decoder_only:
        with torch.no_grad():
            mean = vae.encode(x).latent_dist.mean
    else:
        mean = vae.encode(x).latent_dist.mean
    rec = decode_raw(vae, mean + noise * torch.randn_like(mean))
    w = focus(x, bg)
    l1 = ((rec - x).abs() * w).mean() / w.mean()
    gy = ((rec[..., 1:, :] - rec[..., :-1, :]) - (x[..., 1:, :] - x[..., :-1, :])).abs()
    gx = ((rec[..., 1:] - rec[..., :-1]) - (x[..., 1:] - x[..., :-1])).abs()
    ge = ((gy * w[..., 1:, :]).mean() + (gx * w[..., 1:]).mean()) / w.mean()
    return l1, ge, mean


def vae_batch(rng, n, frames, crop, excluded):
    """n training windows of `frames` consecutive frames (from a random start), cropped to
    crop x crop around the shape's middle position (a random offset of up to a quarter crop),
    and their background colours (-1..1)."""
    xs, bgs = [], []
    for _ in range(n):
        clip, _ = world.random_clip(rng, excluded)
        full = world.draw(clip, rng)
        s = int(rng.integers(0, world.FRAMES - frames + 1))
        win = full[s:s + frames]
        if crop < world.SIZE:
            bgc = np.array(world.COLOURS[clip[0]])
            ys, xs_ = np.nonzero((win[len(win) // 2] != bgc).any(-1))
            cy, cx = (ys.mean(), xs_.mean()) if len(ys) else (world.SIZE / 2, world.SIZE / 2)
            q = crop // 4
            oy = int(np.clip(cy - crop / 2 + rng.integers(-q, q + 1), 0, world.SIZE - crop))
            ox = int(np.clip(cx - crop / 2 + rng.integers(-q, q + 1), 0, world.SIZE - crop))
            win = win[:, oy:oy + crop, ox:ox + crop]
        xs.append(win)
        bgs.append(world.COLOURS[clip[0]])
    return to_tensor(np.stack(xs)), torch.tensor(bgs, dtype=torch.float32) / 127.5 - 1.0


def save_strip(x, rec, path, every=4):
    """Rows of [clip frames | round-trip frames] (every `every`-th frame) as one PNG."""
    from PIL import Image
    sel = list(range(0, x.shape[2], every))
    rows = []
    for a, b in zip(x, rec):
        row = torch.cat([a[:, sel], b[:, sel]], 1)  # [3, 2k, H, W]
        rows.append(torch.cat(list(row.permute(1, 0, 2, 3)), 2))  # [3, H, 2k W]
    img = torch.cat(rows, 1).clamp(-1, 1).add(1).mul(127.5).round().byte().permute(1, 2, 0)
    Image.fromarray(img.numpy()).save(path)


# ---------------------------------------------------------------- text
def make_tokenizer(folder, seed):
    """tokenizer/ from the training captions and the held-out ones; checked: every known word is
    one piece, and transformers' T5TokenizerFast splits captions as SentencePiece does. Returns
    max_sequence_length (the longest caption + </s>, rounded up to 8)."""
    rng = np.random.default_rng(seed + 10)
    _, sets = world.held_out_sets()
    words = world.vocabulary()
    corpus = [world.training_caption(*world.random_clip(rng), rng) for _ in range(20000)]
    sp = write_t5_tokenizer(folder / "tokenizer", corpus, words)
    for w in words:
        if w == ",":
            continue
        assert sp.encode(w, out_type=str) == ["\u2581" + w], f"the tokenizer splits {w!r}"
    held = [c for items in sets.values() for _, c in items]
    from transformers import T5TokenizerFast
    tok = T5TokenizerFast.from_pretrained(folder / "tokenizer")
    for c in corpus[:2000] + held:
        assert tok(c).input_ids == sp.encode(c) + [1], f"T5TokenizerFast differs on {c!r}"
    longest = max(len(sp.encode(c)) for c in corpus + held) + 1
    max_seq = int(math.ceil(longest / 8) * 8)
    log(f"tokenizer: {sp.get_piece_size()} pieces, longest caption {longest} tokens -> "
        f"max_sequence_length {max_seq}")
    return sp.get_piece_size(), max_seq


def token_ids(tok, caps, max_seq):
    t = tok(caps, padding="max_length", max_length=max_seq, truncation=True,
            add_special_tokens=True, return_tensors="pt")
    return t.input_ids, t.attention_mask


def text_states(t5, ids, mask):
    """What WanPipeline gives the transformer: UMT5's states of the caption's tokens, zeros
    after them."""
    return t5(ids, attention_mask=mask).last_hidden_state * mask[..., None]


def parse_targets(clips):
    cols, kinds, motions = list(world.COLOURS), world.KINDS, world.MOTIONS
    return {"bg": torch.tensor([cols.index(c[0]) for c in clips]),
            "kind": torch.tensor([kinds.index(c[1]) for c in clips]),
            "colour": torch.tensor([cols.index(c[2]) for c in clips]),
            "motion": torch.tensor([motions.index(c[3]) for c in clips])}


class Parser(torch.nn.Module):
    """The auxiliary caption parser (not part of the pipeline): four learned queries attend over
    UMT5's tokens and say the background, the kind, the colour and the motion. Its loss teaches
    UMT5 which colour word is the shape's and which the background's before the diffusion loss
    would."""

    HEADS = ("bg", "kind", "colour", "motion")

    def __init__(self, width):
        super().__init__()
        n = len(world.COLOURS)
        self.queries = torch.nn.Parameter(torch.randn(4, width) / width ** 0.5)
        self.out = torch.nn.ModuleList([torch.nn.Linear(width, k) for k in
                                        (n, len(world.KINDS), n, len(world.MOTIONS))])

    def heads(self, hidden, mask):
        att = torch.einsum("qd,bld->bql", self.queries, hidden) / hidden.shape[-1] ** 0.5
        att = att.masked_fill(~mask[:, None, :].bool(), float("-inf")).softmax(-1)
        v = torch.einsum("bql,bld->bqd", att, hidden)
        return {k: lin(v[:, i]) for i, (k, lin) in enumerate(zip(self.HEADS, self.out))}

    def loss(self, hidden, mask, t):
        o = self.heads(hidden, mask)
        return sum(F.cross_entropy(o[k], t[k]) for k in self.HEADS)

    @torch.no_grad()
    def accuracy(self, hidden, mask, t):
        o = self.heads(hidden, mask)
        return {k: (o[k].argmax(-1) == t[k]).float().mean().item() for k in self.HEADS}


# ---------------------------------------------------------------- phases
def build_vae():
    from diffusers import AutoencoderKLWan
    return AutoencoderKLWan(base_dim=16, z_dim=8, dim_mult=[1, 2, 4], num_res_blocks=1,
                            attn_scales=[], temperal_downsample=[True, True], dropout=0.0,
                            latents_mean=[0.0] * 8, latents_std=[1.0] * 8,
                            scale_factor_temporal=4, scale_factor_spatial=4)


def inflate_temporal(vae):
    """Makes the VAE a per-frame one at the start of its window phase: the single frames of the
    first phase reach only the last temporal tap of every causal 3D convolution (the earlier taps
    see the causal zero padding) and never the temporal resampling convolutions, which so keep
    their random weights. Zeroing the earlier taps and making the temporal down-sampling keep the
    latest frame and the up-sampling repeat each frame starts the window phase from the trained
    per-frame VAE instead of from noise in every temporal path (the usual inflation of an image
    autoencoder into a video one)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanResample
    with torch.no_grad():
        resampling = set()
        for m in vae.modules():
            if isinstance(m, WanResample) and hasattr(m, "time_conv"):
                w = m.time_conv.weight  # [k * c, c, 3, 1, 1]: k = 2 repeats (up), 1 (down)
                w.zero_()
                m.time_conv.bias.zero_()
                c = w.shape[1]
                for k in range(w.shape[0] // c):
                    w[k * c:(k + 1) * c, :, -1, 0, 0] = torch.eye(c)
                resampling.add(id(m.time_conv))
        for m in vae.modules():
            if isinstance(m, WanCausalConv3d) and id(m) not in resampling and m.weight.shape[2] > 1:
                m.weight[:, :, :-1] = 0


def train_vae(args, state, excluded):
    """Phase 1, resumable from state/vae_phase.pt."""
    torch.manual_seed(args.seed + 3)
    rng = np.random.default_rng(args.seed + 3)
    vae = build_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    total = args.vae_image_steps + args.vae_steps
    ckpt = state / "vae_phase.pt"
    start, seconds, losses = 0, 0.0, []
    if ckpt.exists():
        c = torch.load(ckpt, weights_only=False)
        vae.load_state_dict(c["vae"])
        opt.load_state_dict(c["opt"])
        rng.bit_generator.state = c["rng"]
        torch.set_rng_state(c["torch_rng"])
        start, seconds, losses = c["step"], c["seconds"], c["losses"]
        log(f"vae phase resumes at step {start}")
    vae.train()
    t0 = time.time() - seconds
    for step in range(start, total):
        if step == args.vae_image_steps:
            torch.save(vae.state_dict(), state / "vae_frames.pt")  # the per-frame VAE, kept
            inflate_temporal(vae)
        if step < args.vae_image_steps:
            x, bg = vae_batch(rng, 16, 1, CROP, excluded)
        else:
            x, bg = vae_batch(rng, 4, args.vae_window, CROP, excluded)
        l1, ge, mean = vae_loss(vae, x, bg, args.vae_noise)
        loss = l1 + ge + 1e-3 * mean.pow(2).mean()
        lr = args.vae_lr * min(1.0, (step + 1) / 100) * (0.55 + 0.45 * math.cos(math.pi * step / total))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(l1.item())
        done = step + 1
        if done % 100 == 0 or done == total:
            log(f"vae {done}: L1 {np.mean(losses[-100:]):.4f} edges {ge.item():.4f} "
                f"({time.time() - t0:.0f} s)")
            torch.save({"vae": vae.state_dict(), "opt": opt.state_dict(),
                        "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                        "step": done, "seconds": time.time() - t0, "losses": losses},
                       ckpt.with_suffix(".tmp"))
            os.rename(ckpt.with_suffix(".tmp"), ckpt)
    vae.eval()
    return vae, {"image_steps": args.vae_image_steps, "window_steps": args.vae_steps,
                 "final_l1": float(np.mean(losses[-100:])), "seconds": time.time() - t0}


def encode_clips(vae, n, n_captions, rng, excluded):
    lat, caps, clips = [], [], []
    with torch.no_grad():
        for i in range(0, n, 8):
            batch = [world.random_clip(rng, excluded) for _ in range(min(8, n - i))]
            x = to_tensor(np.stack([world.draw(c, rng) for c, _ in batch]))
            lat.append(vae.encode(x).latent_dist.mode())
            for c, said in batch:
                caps += [world.training_caption(c, said, rng) for _ in range(n_captions)]
                clips += [c] * n_captions
    return torch.cat(lat), caps, clips, x


def train_text(args, t5, parser, tok, max_seq, excluded, ckpt):
    """Phase 3, resumable from ckpt."""
    params = list(t5.parameters()) + list(parser.parameters())
    opt = torch.optim.AdamW(params, lr=args.text_pre_lr, weight_decay=0.0, betas=(0.9, 0.99))
    rng = np.random.default_rng(args.seed + 9)
    start, seconds, history = 0, 0.0, []
    if ckpt.exists():
        c = torch.load(ckpt, weights_only=False)
        t5.load_state_dict(c["t5"])
        parser.load_state_dict(c["parser"])
        opt.load_state_dict(c["opt"])
        rng.bit_generator.state = c["rng"]
        start, seconds, history = c["step"], c["seconds"], c["history"]
    t0 = time.time() - seconds
    losses = []

    def batch(n):
        drawn = [world.random_clip(rng, excluded) for _ in range(n)]
        caps = [world.training_caption(c, s, rng) for c, s in drawn]
        return (*token_ids(tok, caps, max_seq), parse_targets([c for c, _ in drawn]))

    for step in range(start, args.text_steps):
        ids, mask, t = batch(args.text_batch)
        loss = parser.loss(text_states(t5, ids, mask), mask, t)
        warm = min(1.0, (step + 1) / 100)
        cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.text_steps))
        for g in opt.param_groups:
            g["lr"] = args.text_pre_lr * warm * cos
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        done = step + 1
        if done % 250 == 0 or done == args.text_steps:
            ids, mask, t = batch(256)
            with torch.no_grad():
                acc = parser.accuracy(text_states(t5, ids, mask), mask, t)
            history.append({"step": done, "loss": float(np.mean(losses[-250:])),
                            **{k: round(v, 3) for k, v in acc.items()}})
            log(f"text {done}: loss {history[-1]['loss']:.3f} " +
                " ".join(f"{k} {v:.2f}" for k, v in acc.items()) + f" ({time.time() - t0:.0f} s)")
            torch.save({"t5": t5.state_dict(), "parser": parser.state_dict(),
                        "opt": opt.state_dict(), "rng": rng.bit_generator.state, "step": done,
                        "seconds": time.time() - t0, "history": history}, ckpt.with_suffix(".tmp"))
            os.rename(ckpt.with_suffix(".tmp"), ckpt)
    c = torch.load(ckpt, weights_only=False)
    t5.load_state_dict(c["t5"])
    parser.load_state_dict(c["parser"])
    return {"steps": c["step"], "batch": args.text_batch, "seconds": c["seconds"],
            "history": c["history"]}


def build_models(args, pieces, channels):
    from diffusers import WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel
    torch.manual_seed(args.seed + 2)
    t5 = UMT5EncoderModel(UMT5Config(
        vocab_size=pieces, d_model=args.text_width, d_kv=32, d_ff=2 * args.text_width,
        num_layers=args.text_layers, num_heads=args.text_width // 32,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, eos_token_id=1, pad_token_id=0,
        decoder_start_token_id=0, dropout_rate=0.0))
    torch.manual_seed(args.seed + 4)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=args.heads, attention_head_dim=32,
        in_channels=channels, out_channels=channels, text_dim=args.text_width, freq_dim=256,
        ffn_dim=args.ffn, num_layers=args.layers, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
    return model, t5


def finetune_decoder(vae, args, excluded):
    """Phase 5: the decoder alone on whole clips."""
    torch.manual_seed(args.seed + 7)
    rng = np.random.default_rng(args.seed + 7)
    vae.requires_grad_(False)
    vae.decoder.requires_grad_(True)
    vae.train()
    opt = torch.optim.AdamW(vae.decoder.parameters(), lr=2e-4, weight_decay=0.0)
    t0, losses = time.time(), []
    for step in range(args.decoder_steps):
        x, bg = vae_batch(rng, 2, world.FRAMES, world.SIZE, excluded)
        l1, ge, _ = vae_loss(vae, x, bg, 0.03, decoder_only=True)
        for g in opt.param_groups:
            g["lr"] = 2e-4 * (0.5 + 0.5 * math.cos(math.pi * step / max(1, args.decoder_steps)))
        opt.zero_grad()
        (l1 + ge).backward()
        opt.step()
        losses.append(l1.item())
        if (step + 1) % 50 == 0 or step + 1 == args.decoder_steps:
            log(f"decoder {step + 1}: L1 {np.mean(losses[-50:]):.4f} ({time.time() - t0:.0f} s)")
    vae.eval()
    vae.requires_grad_(False)
    return {"steps": args.decoder_steps,
            "final_l1": float(np.mean(losses[-50:])) if losses else None,
            "seconds": time.time() - t0}


def write_folder(out, state, model, t5, vae, dtype):
    from diffusers import UniPCMultistepScheduler
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.to(torch.float32).save_pretrained(tmp / "transformer")
    t5.save_pretrained(tmp / "text_encoder")
    shutil.copytree(state / "tokenizer", tmp / "tokenizer")
    vae.to(dtype).save_pretrained(tmp / "vae")
    vae.to(torch.float32)
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                            flow_shift=FLOW_SHIFT, num_train_timesteps=1000).save_pretrained(
                                tmp / "scheduler")
    (tmp / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "_diffusers_version": "0.33.1",
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=2) + "\n")
    for part in ("transformer", "text_encoder", "vae"):  # paths of the training machine
        f = tmp / part / "config.json"
        config = json.loads(f.read_text())
        config.pop("_name_or_path", None)
        f.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the pipeline folder to write")
    ap.add_argument("--state", required=True, type=Path, help="what each phase made (resuming)")
    ap.add_argument("--report_dir", type=Path, default=HERE,
                    help="where heldout.json, train_log.json and vae_reconstruction.png go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vae_image_steps", type=int, default=1500, help="VAE on single frames")
    ap.add_argument("--vae_steps", type=int, default=800, help="VAE on frame windows")
    ap.add_argument("--vae_window", type=int, default=9)
    ap.add_argument("--vae_lr", type=float, default=3e-4)
    ap.add_argument("--vae_noise", type=float, default=0.03)
    ap.add_argument("--train_clips", type=int, default=4000)
    ap.add_argument("--captions", type=int, default=4)
    ap.add_argument("--text_steps", type=int, default=1500)
    ap.add_argument("--text_batch", type=int, default=64)
    ap.add_argument("--text_pre_lr", type=float, default=1e-3)
    ap.add_argument("--text_width", type=int, default=128)
    ap.add_argument("--text_layers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3000, help="transformer steps (cosine span)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--text_lr", type=float, default=1e-4)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--heads", type=int, default=4, help="of 32 channels")
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--drop", type=float, default=0.1, help="share of empty captions")
    ap.add_argument("--parse_weight", type=float, default=0.1)
    ap.add_argument("--checkpoint_every", type=int, default=100)
    ap.add_argument("--stop_after", type=float, default=0,
                    help="minutes: save the state and stop once the transformer phase ran this long")
    ap.add_argument("--decoder_steps", type=int, default=150)
    ap.add_argument("--init_from", type=Path,
                    help="a pipeline folder this script wrote (the committed one): a fresh --state "
                         "starts from its tokenizer, VAE, UMT5 and transformer instead of training "
                         "them from scratch, and the transformer phase goes on from its weights "
                         "(a fresh optimizer; the caption parser retrained alone first)")
    ap.add_argument("--dtype", default="bfloat16", help="storage dtype of the VAE")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    state = args.state
    state.mkdir(parents=True, exist_ok=True)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    log_file = state / "train_log.json"
    train_log = json.loads(log_file.read_text()) if log_file.exists() else {
        "seed": args.seed, "threads": args.threads, "torch": torch.__version__}
    train_log.setdefault("runs", []).append({k: str(v) for k, v in vars(args).items()})
    excluded, sets = world.held_out_sets()

    def save_log():
        log_file.write_text(json.dumps(train_log, indent=1) + "\n")

    if "max_sequence_length" not in train_log:
        train_log["pieces"], train_log["max_sequence_length"] = make_tokenizer(state, args.seed)
        save_log()
    max_seq = train_log["max_sequence_length"]
    if args.init_from:
        same = (args.init_from / "tokenizer" / "spiece.model").read_bytes() == \
            (state / "tokenizer" / "spiece.model").read_bytes()
        assert same, f"{args.init_from}'s tokenizer is not the one this script makes"
    from transformers import T5TokenizerFast
    tok = T5TokenizerFast.from_pretrained(state / "tokenizer")

    # 1. The VAE.
    from diffusers import AutoencoderKLWan
    if not (state / "vae").exists() and args.init_from:
        vae = AutoencoderKLWan.from_pretrained(args.init_from / "vae", torch_dtype=torch.float32)
        vae.save_pretrained(state / "vae.tmp")
        os.rename(state / "vae.tmp", state / "vae")
        train_log["vae"] = {"from": str(args.init_from), "seconds": 0.0}
        save_log()
    if not (state / "vae").exists():
        vae, train_log["vae"] = train_vae(args, state, excluded)
        vae.save_pretrained(state / "vae.tmp")
        os.rename(state / "vae.tmp", state / "vae")
        save_log()
    vae = AutoencoderKLWan.from_pretrained(state / "vae", torch_dtype=torch.float32)
    vae.requires_grad_(False)

    # 2. The training set.
    encoded = state / "encoded.pt"
    if not encoded.exists():
        t0 = time.time()
        lat, caps, clips, x = encode_clips(vae, args.train_clips, args.captions,
                                           np.random.default_rng(args.seed + 5), excluded)
        mean = lat.mean((0, 2, 3, 4))
        std = (lat - mean[None, :, None, None, None]).std((0, 2, 3, 4))
        mean, std = [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]
        if args.init_from:  # the latent space the folder's transformer was trained in
            mean, std = list(vae.config.latents_mean), list(vae.config.latents_std)
        vae.register_to_config(latents_mean=mean, latents_std=std)
        m, s = torch.tensor(mean)[None, :, None, None, None], torch.tensor(std)[None, :, None, None, None]
        with torch.no_grad():
            rec = vae.decode(lat[-4:]).sample
        save_strip(x[-4:], rec, args.report_dir / "vae_reconstruction.png")
        ids, mask = token_ids(tok, caps, max_seq)
        torch.save({"x0": (lat - m) / s, "ids": ids, "mask": mask, "mean": mean, "std": std,
                    "targets": parse_targets(clips), "captions": caps[:64]},
                   state / "encoded.tmp")
        os.rename(state / "encoded.tmp", encoded)
        train_log["encode"] = {"clips": args.train_clips, "captions": len(caps),
                               "latents_mean": mean, "latents_std": std,
                               "seconds": time.time() - t0}
        log(f"encoded {args.train_clips} clips ({time.time() - t0:.0f} s)")
        save_log()
    data = torch.load(encoded, weights_only=False)
    vae.register_to_config(latents_mean=data["mean"], latents_std=data["std"])
    x0_all, ids_all, mask_all, targets = data["x0"], data["ids"], data["mask"], data["targets"]
    n_clips = x0_all.shape[0]
    n_captions = ids_all.shape[0] // n_clips
    empty_ids, empty_mask = token_ids(tok, [""], max_seq)

    model, t5 = build_models(args, train_log["pieces"], x0_all.shape[1])
    torch.manual_seed(args.seed + 8)
    parser = Parser(args.text_width)

    # 3. UMT5 and the parser alone.
    ckpt = state / "transformer.pt"
    if args.init_from and not ckpt.exists():
        from diffusers import WanTransformer3DModel
        from transformers import UMT5EncoderModel
        model.load_state_dict(WanTransformer3DModel.from_pretrained(
            args.init_from / "transformer", torch_dtype=torch.float32).state_dict())
        t5.load_state_dict(UMT5EncoderModel.from_pretrained(
            args.init_from / "text_encoder", torch_dtype=torch.float32).state_dict())
        # The folder holds no parser: it learns to read the folder's UMT5 (frozen) first, so that
        # its loss does not send a random parser's gradients into UMT5.
        t5.requires_grad_(False)
        train_log["text"] = train_text(args, t5, parser, tok, max_seq, excluded, state / "text.pt")
        t5.requires_grad_(True)
        save_log()
    elif args.text_steps and not ckpt.exists():
        t5.train()
        train_log["text"] = train_text(args, t5, parser, tok, max_seq, excluded, state / "text.pt")
        save_log()

    # 4. The transformer, UMT5 still learning.
    modules = (model, t5)
    base = [args.lr, args.text_lr, args.text_lr]
    opt = torch.optim.AdamW([{"params": list(model.parameters()), "lr": args.lr},
                             {"params": list(t5.parameters()), "lr": args.text_lr},
                             {"params": list(parser.parameters()), "lr": args.text_lr}],
                            weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(args.seed + 6)
    start, losses = 0, []
    if ckpt.exists():
        c = torch.load(ckpt, weights_only=False)
        for mod, sd in zip(modules, c["weights"]):
            mod.load_state_dict(sd)
        parser.load_state_dict(c["parser"])
        opt.load_state_dict(c["opt"])
        g.set_state(c["generator"])
        emas, start, losses = c["emas"], c["step"], c["losses"]
        log(f"transformer phase resumes at step {start}")
    else:
        emas = [{k: v.detach().clone() for k, v in mod.state_dict().items()} for mod in modules]
    nparams = [sum(p.numel() for p in mod.parameters()) for mod in modules]
    log(f"transformer {nparams[0] / 1e6:.2f} M, UMT5 {nparams[1] / 1e6:.2f} M parameters")

    def save_ckpt(step):
        torch.save({"weights": [mod.state_dict() for mod in modules], "emas": emas,
                    "parser": parser.state_dict(), "opt": opt.state_dict(),
                    "generator": g.get_state(), "step": step, "losses": losses},
                   state / "transformer.tmp")
        os.rename(state / "transformer.tmp", ckpt)

    t0 = time.time()
    stretches = train_log.setdefault("transformer_stretches", [])
    stretch = len(stretches)

    def record_stretch(step):
        """This invocation's stretch as of `step`, saved with every checkpoint, so that a run
        killed between checkpoints still has its time in the log."""
        del stretches[stretch:]
        if step > start:
            stretches.append({"from": start, "to": step, "seconds": time.time() - t0})
        save_log()

    for mod in modules:
        mod.train()
    step, parse_losses = start, []
    while step < args.steps:
        idx = torch.randint(0, n_clips, (args.batch,), generator=g)
        cap = idx * n_captions + torch.randint(0, n_captions, (args.batch,), generator=g)
        x0 = x0_all[idx]
        noise = torch.randn(x0.shape, generator=g)
        s = torch.sigmoid(torch.randn(args.batch, generator=g))
        s = FLOW_SHIFT * s / (1 + (FLOW_SHIFT - 1) * s)
        xt = (1 - s[:, None, None, None, None]) * x0 + s[:, None, None, None, None] * noise
        drop = torch.rand(args.batch, generator=g) < args.drop
        ids, mask = ids_all[cap].clone(), mask_all[cap].clone()
        ids[drop], mask[drop] = empty_ids, empty_mask
        text = text_states(t5, ids, mask)
        pred = model(hidden_states=xt, timestep=s * 1000, encoder_hidden_states=text,
                     return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        losses.append(loss.item())
        keep = ~drop
        parse = parser.loss(text[keep], mask[keep], {k: v[cap][keep] for k, v in targets.items()})
        parse_losses.append(parse.item())
        warm = min(1.0, (step + 1) / 200)
        cos = 0.55 + 0.45 * math.cos(math.pi * step / args.steps)
        for grp, b in zip(opt.param_groups, base):
            grp["lr"] = b * warm * cos
        opt.zero_grad()
        (loss + args.parse_weight * parse).backward()
        torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], 1.0)
        torch.nn.utils.clip_grad_norm_(opt.param_groups[1]["params"] + opt.param_groups[2]["params"], 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema, mod in zip(emas, modules):
                for k, v in mod.state_dict().items():
                    ema[k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        step += 1
        if step % 100 == 0 or step == args.steps:
            log(f"transformer {step}: loss {np.mean(losses[-100:]):.4f} parse "
                f"{np.mean(parse_losses[-100:]):.3f} ({time.time() - t0:.0f} s)")
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_ckpt(step)
            record_stretch(step)
            if args.stop_after and time.time() - t0 > 60 * args.stop_after and step < args.steps:
                log(f"stopped after step {step}; rerun the same command to go on")
                return
    record_stretch(step)
    train_log["transformer"] = {"parameters": nparams, "steps": step,
                                "final_loss": float(np.mean(losses[-200:]))}
    save_log()
    for ema, mod in zip(emas, modules):
        mod.load_state_dict(ema)
        mod.eval()

    # 5. The decoder on whole clips.
    if "decoder" not in train_log:
        train_log["decoder"] = finetune_decoder(vae, args, excluded)
        save_log()
    with torch.no_grad():
        x, _ = vae_batch(np.random.default_rng(args.seed + 11), 4, world.FRAMES, world.SIZE, excluded)
        save_strip(x, vae.decode(vae.encode(x).latent_dist.mode()).sample,
                   args.report_dir / "vae_reconstruction.png")
    write_folder(args.out, state, model, t5, vae, getattr(torch, args.dtype))
    world.write_held_out(args.report_dir / "heldout.json", sets, score.STEPS, score.GUIDANCE,
                         max_seq)
    train_log["total_seconds"] = sum(train_log[k]["seconds"] for k in ("vae", "encode", "text",
                                                                       "decoder")
                                     if k in train_log) + \
        sum(s["seconds"] for s in train_log["transformer_stretches"])
    save_log()
    (args.report_dir / "train_log.json").write_text(json.dumps(train_log, indent=1) + "\n")
    log(f"trained in {train_log['total_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
