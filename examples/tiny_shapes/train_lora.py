"""Trains "night": a LoRA adapter for tiny-shapes that draws every scene on a black background.

    V/bin/python examples/tiny_shapes/train_lora.py

Loads the committed pipeline (models/flux/tiny_shapes) in fp32, adds a PEFT LoRA (r 8, alpha 8)
to the transformer alone (text encoders and VAE frozen) and trains it by rectified flow as
train.py's phase 3 trains the transformer: the caption is the scene's own ("... on a blue
background"), the picture is the same scene drawn on black. Scenes come from shapes.py's
distribution, none of them held out (train.py's exclusion) and none with a black shape (it would
vanish on black). Deterministic from --seed on a fixed thread count (~4 min of training on 2
cores; ~6 min in all with the encoding and the score).

Prompts are encoded by the pipeline's own encode_prompt. faithful_t5_tokenizer checks that
tokenizer_2 splits captions as the SentencePiece model does (train.py's unigram model splits
alike in SentencePiece and transformers 4 and 5) and mends it where it does not.

Writes, next to this file:
  lora_night.safetensors  the adapter, saved by diffusers' FluxPipeline.save_lora_weights
                          (fp32; safetensors header metadata in sorted order, the LoraConfig's
                          target_modules sorted and base_model_name_or_path null, so a rerun
                          writes the same bytes);
  lora_night_log.json     the config, the loss every 25 steps, the times and the held-out score;
  lora_night_preview.png  four held-out scenes: without the adapter | with it.

The score: --eval held-out scenes spread over heldout.json as score.py spreads them (the
generator of the i-th scene of that spread is seeded i, as score.py seeds it; scenes with a black
shape are skipped), drawn by diffusers' FluxPipeline (fp32, 16 steps, 96x96) loaded fresh, with
the adapter loaded by load_lora_weights:
  - without the adapter, checked against the scene as captioned and against its night version;
  - with the adapter at scale 1, checked against the night version (background "black");
  checked for colour and place (score.py's colour_place), the adapter's change being the
  background's;
  - with the adapter at scale 0, the largest pixel difference to the pictures without it.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import score  # noqa: E402
import shapes  # noqa: E402
import train  # noqa: E402

ADAPTER = "night"
WEIGHT_NAME = "lora_night.safetensors"
# diffusers' names inside FluxTransformer2DModel (PEFT matches a module whose name is one of
# these or ends with "." + one of these): the attention projections of both kinds of block, the
# modulation (AdaLayerNormZero / AdaLayerNormZeroSingle) linears, and the single blocks' MLP
# in and out ("proj_out" also matches the transformer's final projection).
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
           "to_add_out", "norm1.linear", "norm1_context.linear", "norm.linear", "proj_mlp",
           "proj_out"]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def night(scene):
    """A held-out scene (heldout.json's form) as the adapter should draw it."""
    return dict(scene, background="black")


def has_black_shape(scene):
    return any(colour == "black" for _, colour, _, _ in scene[1])


def sorted_header_metadata(path):
    """The safetensors header's __metadata__ entries in sorted order (safetensors writes that map
    in hash order, which changes from process to process); tensors and header length unchanged."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n]
    obj = json.loads(header)

    def dump(o):
        return json.dumps(o, separators=(",", ":"), ensure_ascii=False).encode()

    assert dump(obj) == header.rstrip(b" "), path  # serde_json's formatting, reproduced
    obj["__metadata__"] = dict(sorted(obj["__metadata__"].items()))
    new = dump(obj)
    path.write_bytes(data[:8] + new + b" " * (n - len(new)) + data[8 + n:])


def faithful_t5_tokenizer(pipe, folder):
    """Makes pipe.tokenizer_2 split captions as the SentencePiece model does (as train.py trained
    the model and as xfuser tokenizes). transformers 5's T5Tokenizer reads spiece.model into a
    Unigram model with the BPE model's scores, which splits some caption words ("the" into
    "t" + "he"). Every caption word is one piece here, so a Unigram model whose pieces all score
    the same (fewest pieces wins) gives SentencePiece's ids; checked on every one-shape caption
    and 3,000 random ones. Returns whether the tokenizer had to be replaced."""
    import sentencepiece as spm
    from tokenizers.models import Unigram
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer_2" / "spiece.model"))
    rng = np.random.default_rng(5)
    caps = [shapes.training_caption(shapes.random_spec(rng), rng) for _ in range(3000)]
    caps += [shapes.describe(shapes.Spec(s), rng) for s in shapes.single_scenes()]

    def faithful():
        return all(pipe.tokenizer_2(c).input_ids == sp.encode(c) + [1] for c in caps)

    if faithful():
        return False
    pipe.tokenizer_2.backend_tokenizer.model = Unigram(
        [(sp.id_to_piece(i), -1.0) for i in range(sp.get_piece_size())], unk_id=sp.unk_id(),
        byte_fallback=False)
    assert faithful(), "tokenizer_2 still differs from SentencePiece"
    return True


def training_set(pipe, n, rng, excluded, excluded_multi, max_seq):
    """n scenes of the training distribution (no held-out part, no black shape): packed, scaled
    latents of their pictures drawn on black and the pipeline's prompt embeddings of a caption
    of each (shapes.training_caption: any phrasing, the background said or not)."""
    vae = pipe.vae
    lat, pe, pooled = [], [], []
    with torch.no_grad():
        for i in range(0, n, 64):
            specs = []
            while len(specs) < min(64, n - i):
                sp = shapes.random_spec(rng, excluded, excluded_multi)
                if not has_black_shape(sp.scene):
                    specs.append(sp)
            x = train.to_tensor([shapes.draw(("black", sp.scene[1]), rng) for sp in specs])
            z = vae.encode(x).latent_dist.mode()
            lat.append(train.pack((z - vae.config.shift_factor) * vae.config.scaling_factor))
            e, p, _ = pipe.encode_prompt(prompt=[shapes.training_caption(sp, rng) for sp in specs],
                                         prompt_2=None, max_sequence_length=max_seq)
            pe.append(e)
            pooled.append(p)
    return torch.cat(lat), torch.cat(pe), torch.cat(pooled)


def train_adapter(args, log_doc):
    from diffusers import FluxPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = FluxPipeline.from_pretrained(args.pipeline, torch_dtype=torch.float32)
    log_doc["tokenizer_2_replaced"] = faithful_t5_tokenizer(pipe, args.pipeline)
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        m.requires_grad_(False)
        m.eval()
    excluded, excluded_multi, _ = shapes.held_out_sets()
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    x0_all, pe_all, pooled_all = training_set(pipe, args.pictures, rng, excluded, excluded_multi,
                                              args.max_seq)
    log_doc["data_seconds"] = round(time.time() - t0, 1)
    log(f"{args.pictures} night pictures encoded ({time.time() - t0:.0f} s)")

    torch.manual_seed(args.seed + 1)  # the LoRA A matrices' initialisation (B starts at zero)
    config = LoraConfig(r=args.r, lora_alpha=args.alpha, target_modules=TARGETS,
                        init_lora_weights=True, lora_dropout=0.0)
    model = pipe.transformer
    model.add_adapter(config, adapter_name=ADAPTER)
    params = [p for p in model.parameters() if p.requires_grad]
    from peft.tuners.lora import LoraLayer
    modules = sorted(n for n, m in model.named_modules()
                     if isinstance(m, LoraLayer) and ADAPTER in m.lora_A)
    nparams = sum(p.numel() for p in params)
    log(f"LoRA: {len(modules)} modules, {nparams} parameters")
    log_doc["lora_modules"] = modules
    log_doc["lora_parameters"] = nparams

    vae_scale = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
    img_ids, txt_ids, mu = train.flux_ids(args.max_seq, vae_scale)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(args.seed + 2)
    model.train()
    losses, curve = [], []
    t0 = time.time()
    for step in range(args.steps):
        idx, _, x0, noise, s, guidance, xt = train.flow_batch(x0_all.shape[0], 1, x0_all,
                                                              args.batch, mu, g)
        pred = model(hidden_states=xt, encoder_hidden_states=pe_all[idx],
                     pooled_projections=pooled_all[idx], timestep=s, guidance=guidance,
                     img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        lr = args.lr * min(1.0, (step + 1) / 25) * (0.55 + 0.45 * math.cos(math.pi * step /
                                                                           args.steps))
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 25 == 0 or step == 0:
            mean = float(np.mean(losses[-25:]))
            curve.append({"step": step + 1, "loss": round(mean, 5)})
            log(f"step {step + 1}: loss {mean:.4f} lr {lr:.2e} ({time.time() - t0:.0f} s)")
    model.eval()
    log_doc["train_seconds"] = round(time.time() - t0, 1)
    log_doc["loss_every_25_steps"] = curve

    # Saved by diffusers; the LoraConfig made deterministic first (a set's order changes from
    # run to run; add_adapter records the checkout's path as base_model_name_or_path).
    peft_config = model.peft_config[ADAPTER]
    peft_config.target_modules = sorted(peft_config.target_modules)
    peft_config.base_model_name_or_path = None
    layers = {k: v.detach().to(torch.float32).contiguous()
              for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}
    FluxPipeline.save_lora_weights(args.out_dir, transformer_lora_layers=layers,
                                   transformer_lora_adapter_metadata=peft_config.to_dict(),
                                   weight_name=WEIGHT_NAME)
    sorted_header_metadata(args.out_dir / WEIGHT_NAME)
    log(f"saved {args.out_dir / WEIGHT_NAME} ({(args.out_dir / WEIGHT_NAME).stat().st_size} bytes)")


def evaluate(args, log_doc):
    from diffusers import FluxPipeline
    held = json.loads((HERE / "heldout.json").read_text())
    scenes = score.spread(held["sets"]["single"], args.eval)
    kept = [i for i, sc in enumerate(scenes)
            if not any(s["colour"] == "black" for s in sc["shapes"])]
    pipe = FluxPipeline.from_pretrained(args.pipeline, torch_dtype=torch.float32)
    log_doc["eval_tokenizer_2_replaced"] = faithful_t5_tokenizer(pipe, args.pipeline)

    def run(i):
        out = pipe(scenes[i]["caption"], height=shapes.SIZE, width=shapes.SIZE,
                   num_inference_steps=score.STEPS, max_sequence_length=args.max_seq,
                   guidance_scale=3.5, generator=torch.Generator().manual_seed(i),
                   output_type="np").images[0]
        return (out * 255).round().clip(0, 255).astype(np.uint8)

    t0 = time.time()
    base = {i: run(i) for i in range(len(scenes))}
    pipe.load_lora_weights(args.out_dir, weight_name=WEIGHT_NAME, adapter_name=ADAPTER)
    pipe.set_adapters([ADAPTER], [1.0])
    lora = {i: run(i) for i in kept}
    pipe.set_adapters([ADAPTER], [0.0])
    zero = {i: run(i) for i in kept}
    log_doc["eval_seconds"] = round(time.time() - t0, 1)

    def rate(pics, target, idx):
        fails = [scenes[i]["caption"] for i in idx
                 if not score.check(pics[i], target(scenes[i]), held)["colour_place"]]
        return {"scenes": len(idx), "passed": len(idx) - len(fails),
                "rate": round((len(idx) - len(fails)) / max(1, len(idx)), 4),
                "first_failures": fails[:10]}

    res = {
        "scenes": len(scenes), "skipped_black_shape": len(scenes) - len(kept),
        "seed_rule": "generator seed = index of the scene in score.spread(heldout, count)",
        "adapter_1_vs_night": rate(lora, night, kept),
        "base_vs_original_all": rate(base, lambda s: s, range(len(scenes))),
        "base_vs_original": rate(base, lambda s: s, kept),
        "base_vs_night": rate(base, night, kept),
        "base_already_black_background": sum(scenes[i]["background"] == "black" for i in kept),
        "adapter_0_max_abs_pixel_diff_to_base": int(max(
            np.abs(zero[i].astype(np.int32) - base[i].astype(np.int32)).max() for i in kept)),
    }
    log_doc["heldout_eval"] = res
    log(json.dumps({k: (v if not isinstance(v, dict) else {a: b for a, b in v.items()
                                                          if a != "first_failures"})
                    for k, v in res.items()}))
    if args.preview:
        from PIL import Image
        rows = [np.concatenate([base[i], lora[i]], 1) for i in kept[:4]]
        Image.fromarray(np.concatenate(rows, 0)).save(args.out_dir / "lora_night_preview.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", type=Path, default=ROOT / "models/flux/tiny_shapes")
    ap.add_argument("--out_dir", type=Path, default=HERE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pictures", type=int, default=3072, help="night pictures, encoded once")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=8)
    ap.add_argument("--eval", type=int, default=100, help="held-out scenes scored; 0: none")
    ap.add_argument("--eval_only", action="store_true", help="score the saved adapter")
    ap.add_argument("--no_preview", dest="preview", action="store_false")
    args = ap.parse_args()
    args.max_seq = json.loads((HERE / "heldout.json").read_text())["max_sequence_length"]
    torch.set_num_threads(args.threads)
    log_file = args.out_dir / "lora_night_log.json"
    if args.eval_only:
        log_doc = json.loads(log_file.read_text())
    else:
        log_doc = {"config": {"r": args.r, "lora_alpha": args.alpha, "target_modules": TARGETS,
                              "init_lora_weights": True, "steps": args.steps,
                              "batch": args.batch, "lr": args.lr,
                              "schedule": "25 warm-up steps, cosine to 0.1 lr; AdamW betas "
                                          "(0.9, 0.99), no weight decay; gradients clipped at 1",
                              "pictures": args.pictures, "seed": args.seed,
                              "threads": args.threads, "max_sequence_length": args.max_seq,
                              "torch": torch.__version__}}
        t0 = time.time()
        train_adapter(args, log_doc)
        log_doc["train_and_save_seconds"] = round(time.time() - t0, 1)
    if args.eval:
        evaluate(args, log_doc)
    log_file.write_text(json.dumps(log_doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
