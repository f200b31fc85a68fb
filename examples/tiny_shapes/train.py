"""Trains tiny-shapes: a FLUX.1-architecture diffusers pipeline that draws captioned shapes.

    python3 -m venv V && V/bin/pip install -r tests/fixtures/requirements.txt
    V/bin/python examples/tiny_shapes/train.py --out models/flux/tiny_shapes

Writes a normal FluxPipeline folder (model_index.json, scheduler/, tokenizer/ (CLIP byte-level
BPE whose merges make every caption word one token), tokenizer_2/ (a SentencePiece BPE model
holding every caption word as one piece), text_encoder/ (CLIPTextModel), text_encoder_2/
(T5EncoderModel), transformer/ (FluxTransformer2DModel), vae/ (AutoencoderKL)) that diffusers
and xfuser both load unchanged, plus heldout.json (the one-shape scenes never shown in training,
for tests/test_tiny_shapes.cpp) and train_log.json (losses, times, the held-out score measured
here with diffusers' FluxPipeline).

What is trained, in order (deterministic from --seed on a fixed thread count; ~1 h on 2 cores):
  1. the VAE, on random 64x64 crops of drawn pictures (it is fully convolutional): L1 of the
     decoded latent mean plus noise of std 0.1, and a small L2 on the latents;
     then shift_factor and scaling_factor are set from the latents' mean and std, as FLUX.1's;
  2. a fixed set of pictures is encoded once;
  3. the transformer, T5 and CLIP together, from seeded random weights, by rectified flow (the
     pipeline's velocity: noise - x0, at sigmas drawn logit-normal and shifted as the pipeline's
     schedule is at 128x128), with an EMA of the weights, which is what is saved. FLUX gives text
     tokens no position (txt_ids are zero), so which colour word is the background's must come
     from the text encoders: they learn it here. The guidance embedding's output is held at zero:
     this model has no distilled guidance, and a guidance value changes nothing;
  4. the VAE's decoder alone, on whole pictures, from the stored VAE (the encoder and so the
     latent space stay as the transformer learned them).
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
HELD_OUT_SEED = 1234
HELD_OUT_COUNT = 300


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- tokenizers
def write_clip_tokenizer(out, words):
    """CLIP's layout: the 256 byte symbols, the same with </w>, one entry per merge, then
    <|startoftext|> and <|endoftext|>. Merges: the most frequent adjacent pair over the words
    (ties: the smallest pair), until every word is one symbol."""
    from transformers.models.clip.tokenization_clip import bytes_to_unicode
    b2u = bytes_to_unicode()  # CLIP's (GPT-2's) byte-to-symbol map
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


def write_t5_tokenizer(out, corpus):
    import sentencepiece as spm
    out.mkdir(parents=True)
    text = out / ".corpus.txt"
    text.write_text("\n".join(corpus) + "\n")
    # T5's id layout: <pad> 0, </s> 1, <unk> 2, no BOS.
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "spiece"), vocab_size=120, model_type="bpe",
        hard_vocab_limit=False, character_coverage=1.0, num_threads=1, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        minloglevel=2)
    text.unlink()
    (out / "spiece.vocab").unlink()
    strip_paths(out / "spiece.model")
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


def flux_ids(max_seq):
    """FluxPipeline's img_ids for the 128x128 latent grid, its zero txt_ids, and its schedule's mu
    at this size (sigma' = e^mu s / (1 + (e^mu - 1) s))."""
    hl = shapes.SIZE // 16
    img_ids = torch.zeros(hl, hl, 3)
    img_ids[..., 1] = torch.arange(hl)[:, None]
    img_ids[..., 2] = torch.arange(hl)[None, :]
    m = (1.15 - 0.5) / (4096 - 256)
    return img_ids.reshape(-1, 3), torch.zeros(max_seq, 3), hl * hl * m + (0.5 - m * 256)


def flow_batch(x0_all, batch, mu, g):
    """One rectified-flow batch: picture indices, x0, noise, sigmas (logit-normal, shifted by mu),
    guidance values (uniform 1..5; the guidance embedding is held at zero, so they change
    nothing) and x_t."""
    idx = torch.randint(0, x0_all.shape[0], (batch,), generator=g)
    x0 = x0_all[idx]
    noise = torch.randn(x0.shape, generator=g)
    s = torch.sigmoid(torch.randn(batch, generator=g))
    s = math.exp(mu) * s / (1 + (math.exp(mu) - 1) * s)
    guidance = 1.0 + 4.0 * torch.rand(batch, generator=g)
    xt = (1 - s[:, None, None]) * x0 + s[:, None, None] * noise
    return idx, x0, noise, s, guidance, xt


def encode_pictures(vae, n, rng, excluded):
    """n fresh scenes drawn from rng (none held out), VAE-encoded (latent mode) in batches of
    64: (raw latents, captions, the last batch's pixels)."""
    caps, lat = [], []
    with torch.no_grad():
        for i in range(0, n, 64):
            scenes = [shapes.random_scene(rng, excluded) for _ in range(min(64, n - i))]
            x = to_tensor([shapes.draw(sc, rng) for sc in scenes])
            lat.append(vae.encode(x).latent_dist.mode())
            caps += [shapes.caption(sc) for sc in scenes]
    return torch.cat(lat), caps, x


def save_pairs(pair, path):
    """Rows of [picture | its VAE round trip] ([B, 3, H, 2W] in -1..1) as one PNG."""
    from PIL import Image
    Image.fromarray(pair.clamp(-1, 1).add(1).mul(127.5).round().byte().permute(0, 2, 3, 1)
                    .reshape(-1, 2 * shapes.SIZE, 3).numpy()).save(path)


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the pipeline folder to write")
    ap.add_argument("--report_dir", type=Path, default=Path(__file__).resolve().parent,
                    help="where heldout.json, train_log.json and preview.png go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vae_steps", type=int, default=1200)
    ap.add_argument("--vae_lr", type=float, default=1e-3)
    ap.add_argument("--train_pictures", type=int, default=12000)
    ap.add_argument("--steps", type=int, default=2600,
                    help="phase 3: the transformer and the text encoders together")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--text_lr", type=float, default=1e-3, help="the text encoders' in phase 3")
    ap.add_argument("--decoder_steps", type=int, default=400,
                    help="phase 4: the decoder alone on whole pictures")
    ap.add_argument("--from_phase", type=int, default=1, choices=[1, 4],
                    help="4: start there, on the folder phases 1-3 wrote (--out)")
    ap.add_argument("--eval", type=int, default=100, help="held-out scenes scored at the end")
    ap.add_argument("--dtype", default="bfloat16", help="storage dtype of the transformer/VAE")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.from_phase > 1:
        held = shapes.held_out(HELD_OUT_SEED, HELD_OUT_COUNT)
        finish(args, held, json.loads((args.report_dir / "train_log.json").read_text())[
            "max_sequence_length"])
        return
    torch.manual_seed(args.seed)
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    out = args.out
    if out.exists() and any(out.iterdir()):  # phases 1-3 write a new folder
        sys.exit(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    rng = np.random.default_rng(args.seed)
    held = shapes.held_out(HELD_OUT_SEED, HELD_OUT_COUNT)
    excluded = set(held)
    train_log = {"seed": args.seed, "threads": args.threads, "args": {
        k: str(v) for k, v in vars(args).items()}}

    # Tokenizers.
    words = shapes.vocabulary()
    clip_vocab = write_clip_tokenizer(out / "tokenizer", words)
    corpus = [shapes.caption(shapes.random_scene(rng, excluded)) for _ in range(3000)]
    corpus += [shapes.caption(s) for s in shapes.single_scenes()]
    sp = write_t5_tokenizer(out / "tokenizer_2", corpus)
    for w in words:
        pieces = sp.encode(w, out_type=str)
        assert pieces == ["▁" + w], f"T5 tokenizer splits {w!r}: {pieces}"
    longest = max(len(sp.encode(c)) for c in corpus) + 1
    max_seq = int(math.ceil(longest / 8) * 8)
    log(f"tokenizers: CLIP {clip_vocab} entries, T5 {sp.get_piece_size()} pieces, "
        f"longest caption {longest} T5 tokens -> max_sequence_length {max_seq}")
    train_log["max_sequence_length"] = max_seq

    from transformers import CLIPTokenizer, T5TokenizerFast
    tok1 = CLIPTokenizer.from_pretrained(out / "tokenizer")
    tok2 = T5TokenizerFast.from_pretrained(out / "tokenizer_2")
    for c in corpus[:50]:
        assert tok2(c).input_ids == sp.encode(c) + [1], f"T5TokenizerFast differs on {c!r}"
    for w in words:
        ids = tok1(w).input_ids
        assert len(ids) == 3, f"CLIP tokenizer splits {w!r}: {ids}"

    # Text encoders: seeded random, trained with the transformer in phase 3.
    torch.manual_seed(args.seed + 1)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=clip_vocab, hidden_size=64, intermediate_size=128, projection_dim=64,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=CLIP_MAX,
        hidden_act="quick_gelu", bos_token_id=clip_vocab - 2, eos_token_id=clip_vocab - 1,
        pad_token_id=clip_vocab - 1))
    torch.manual_seed(args.seed + 2)
    t5 = T5EncoderModel(T5Config(
        vocab_size=sp.get_piece_size(), d_model=64, d_kv=16, d_ff=128, num_layers=2,
        num_heads=4, feed_forward_proj="gated-gelu", eos_token_id=1, pad_token_id=0,
        decoder_start_token_id=0, dropout_rate=0.0))

    # 1. The VAE. One group in every GroupNorm: with several, a flat colour (most of every
    # picture here) normalises to the same features whatever the colour, and the VAE cannot
    # learn the colours.
    torch.manual_seed(args.seed + 3)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(16, 32, 64, 64),
        layers_per_block=1, act_fn="silu", latent_channels=8, norm_num_groups=1,
        sample_size=shapes.SIZE, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=True, force_upcast=True)
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    vae.train()
    t0 = time.time()
    vae_losses = []
    for step in range(args.vae_steps):
        imgs = [shapes.draw(shapes.random_scene(rng, excluded), rng) for _ in range(16)]
        x = to_tensor(imgs)
        oy, ox = rng.integers(0, shapes.SIZE - 64, size=2)
        x = x[:, :, oy:oy + 64, ox:ox + 64]
        # The latent mean plus a little noise (not the posterior sample: its initial unit
        # variance drowns the signal for hundreds of steps), so the decoder also learns to
        # forgive small errors of the transformer; a small L2 keeps the latents bounded.
        mean = vae.encode(x).latent_dist.mean
        rec = vae.decode(mean + 0.1 * torch.randn_like(mean)).sample
        rec_loss = (rec - x).abs().mean()
        kl = mean.pow(2).mean()
        loss = rec_loss + 1e-3 * kl
        lr = args.vae_lr * min(1.0, (step + 1) / 100) * (0.5 + 0.5 * math.cos(math.pi * step /
                                                                        args.vae_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss.backward()
        # At 2e-3 and without clipping the VAE can stall on a picture's mean colour (L1 0.39 for
        # 800 steps on seed 0 once the scene mix changed); 1e-3 and clipping left it at 0.17 by
        # step 250 on the same data.
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        vae_losses.append(rec_loss.item())
        if step % 100 == 0 or step == args.vae_steps - 1:
            log(f"vae {step}: L1 {np.mean(vae_losses[-100:]):.4f} |z|^2 {kl.item():.3f} "
                f"({time.time() - t0:.0f} s)")
    vae.eval()
    train_log["vae"] = {"steps": args.vae_steps, "final_l1": float(np.mean(vae_losses[-100:])),
                        "seconds": time.time() - t0}

    # 2. The training set, encoded once.
    t0 = time.time()
    n = args.train_pictures
    lat, caps, x = encode_pictures(vae, n, rng, excluded)
    with torch.no_grad():
        shift = lat.mean().item()
        scale = 1.0 / (lat - shift).std().item()
        vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
        lat = (lat - vae.config.shift_factor) * vae.config.scaling_factor
        x0_all = pack(lat)
        # The last pictures encoded, beside their decoded latents.
        pair = torch.cat([x[-8:], vae.decode(
            lat[-8:] / vae.config.scaling_factor + vae.config.shift_factor).sample], 3)
        save_pairs(pair, args.report_dir / "vae_reconstruction.png")
    vae_dtype = getattr(torch, args.dtype)
    vae.to(vae_dtype).save_pretrained(out / "vae")
    vae.to(torch.float32)
    ids1_all = tok1(caps, padding="max_length", max_length=CLIP_MAX, truncation=True,
                    return_tensors="pt").input_ids
    ids2_all = tok2(caps, padding="max_length", max_length=max_seq, truncation=True,
                    return_tensors="pt").input_ids
    log(f"encoded {n} pictures: latents {tuple(lat.shape)}, shift {vae.config.shift_factor}, "
        f"scale {vae.config.scaling_factor} ({time.time() - t0:.0f} s)")
    train_log["encode_seconds"] = time.time() - t0

    # 3. The transformer, T5 and CLIP together.
    torch.manual_seed(args.seed + 4)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=x0_all.shape[-1], num_layers=2, num_single_layers=4,
        attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
        pooled_projection_dim=64, guidance_embeds=True, axes_dims_rope=(8, 12, 12))
    # The guidance embedding's output layer is zero and stays so: a guidance value adds nothing.
    guidance_out = model.time_text_embed.guidance_embedder.linear_2
    with torch.no_grad():
        guidance_out.weight.zero_()
        guidance_out.bias.zero_()
    guidance_out.requires_grad_(False)
    modules = (model, t5, clip)
    emas = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
    nparams = sum(p.numel() for p in model.parameters())
    log(f"transformer: {nparams / 1e6:.2f} M parameters")
    img_ids, txt_ids, mu = flux_ids(max_seq)
    sched = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5,
                                            max_image_seq_len=4096, max_shift=1.15, shift=3.0,
                                            use_dynamic_shifting=True)
    trained = [[p for p in m.parameters() if p.requires_grad] for m in modules]
    base = [args.lr, args.text_lr, args.text_lr]
    opt = torch.optim.AdamW([{"params": ps, "lr": b} for ps, b in zip(trained, base)],
                            weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(args.seed + 5)
    t0 = time.time()
    losses = []
    for m in modules:
        m.train()
    for step in range(args.steps):
        idx, x0, noise, s, guidance, xt = flow_batch(x0_all, args.batch, mu, g)
        # fp32: CPU autocast to bf16 is ~20x slower here (torch 2.5.1).
        pred = model(hidden_states=xt, encoder_hidden_states=t5(ids2_all[idx])[0],
                     pooled_projections=clip(ids1_all[idx]).pooler_output, timestep=s,
                     guidance=guidance, img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        warm = min(1.0, (step + 1) / 200)
        cos = 0.55 + 0.45 * math.cos(math.pi * step / args.steps)
        for grp, b in zip(opt.param_groups, base):
            grp["lr"] = b * warm * cos
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for ps in trained for p in ps], 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema, m in zip(emas, modules):
                for k, v in m.state_dict().items():
                    ema[k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        losses.append(loss.item())
        if step % 100 == 0 or step == args.steps - 1:
            log(f"transformer {step}: loss {np.mean(losses[-100:]):.4f} "
                f"lr {args.lr * warm * cos:.2e} ({time.time() - t0:.0f} s)")
    for ema, m in zip(emas, modules):
        m.load_state_dict(ema)
        m.eval()
    model.to(vae_dtype).save_pretrained(out / "transformer")
    clip.save_pretrained(out / "text_encoder")
    t5.save_pretrained(out / "text_encoder_2")
    train_log["transformer"] = {"parameters": nparams, "steps": args.steps,
                                "final_loss": float(np.mean(losses[-200:])),
                                "seconds": time.time() - t0}
    sched.save_pretrained(out / "scheduler")
    (out / "model_index.json").write_text(json.dumps({
        "_class_name": "FluxPipeline", "_diffusers_version": "0.33.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"]}, indent=2) + "\n")
    import score
    shapes.write_held_out(args.report_dir / "heldout.json", held, score.BOX, score.STEPS)
    train_log["phases_1_3_seconds"] = time.time() - t_start
    (args.report_dir / "train_log.json").write_text(json.dumps(train_log, indent=1) + "\n")
    finish(args, held, max_seq)


def finetune_decoder(folder, seed, steps, excluded, dtype):
    """4. The decoder alone, on whole 128x128 pictures, from the VAE as stored (so a run that
    starts here from a saved folder does what the whole run does). The encoder, hence the latent
    space and the transformer's targets, does not change; the decoder learns sharper edges than
    the 64x64 crops taught it, from the latent mean plus noise of std 0.1."""
    from diffusers import AutoencoderKL
    vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    torch.manual_seed(seed + 6)
    rng = np.random.default_rng(seed + 6)
    vae.requires_grad_(False)
    vae.decoder.requires_grad_(True)
    opt = torch.optim.AdamW(vae.decoder.parameters(), lr=5e-4, weight_decay=0.0)
    t0 = time.time()
    losses = []
    for step in range(steps):
        x = to_tensor([shapes.draw(shapes.random_scene(rng, excluded), rng) for _ in range(8)])
        with torch.no_grad():
            mean = vae.encode(x).latent_dist.mean
        rec = vae.decode(mean + 0.1 * torch.randn_like(mean)).sample
        loss = (rec - x).abs().mean()
        for g in opt.param_groups:
            g["lr"] = 5e-4 * (0.5 + 0.5 * math.cos(math.pi * step / steps))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            log(f"decoder {step}: L1 {np.mean(losses[-100:]):.4f} ({time.time() - t0:.0f} s)")
    vae.eval()
    with torch.no_grad():
        x = to_tensor([shapes.draw(shapes.random_scene(rng, excluded), rng) for _ in range(8)])
        pair = torch.cat([x, vae.decode(vae.encode(x).latent_dist.mean).sample], 3)
    vae.to(dtype).save_pretrained(folder / "vae")
    return {"steps": steps, "final_l1": float(np.mean(losses[-100:])),
            "seconds": time.time() - t0}, pair


def finish(args, held, max_seq):
    """Phase 4 and the held-out score, on the folder phases 1-3 wrote."""
    import score
    log_file = args.report_dir / "train_log.json"
    train_log = json.loads(log_file.read_text())
    if args.decoder_steps:
        train_log["decoder"], pair = finetune_decoder(args.out, args.seed, args.decoder_steps,
                                                      set(held), getattr(torch, args.dtype))
        save_pairs(pair, args.report_dir / "vae_reconstruction.png")
    train_log["total_seconds"] = train_log["phases_1_3_seconds"] + train_log.get(
        "decoder", {}).get("seconds", 0)
    log(f"trained in {train_log['total_seconds'] / 60:.1f} min")
    # Score held-out scenes through diffusers' FluxPipeline (what the C++ test does in xfuser).
    if args.eval:
        res = score.score_pipeline(args.out, score.spread(held, args.eval), max_seq,
                                   args.report_dir / "preview.png")
        train_log["heldout_eval"] = res
        log(f"held-out: {res}")
    log_file.write_text(json.dumps(train_log, indent=1) + "\n")


if __name__ == "__main__":
    main()
