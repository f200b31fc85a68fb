# HunyuanVideo-1.5's text side against transformers 4.57.1 / diffusers 0.36.0: the
# Qwen2_5_VLTextModel variant of the decoder-only encoder (and a Qwen2_5_VLForConditionalGeneration
# folder's language model), the ByT5-style T5 encoder, Qwen2 / ByT5 tokenizer ids, and the
# pipeline's _get_mllm_prompt_embeds / _get_byt5_prompt_embeds / extract_glyph_texts.
xfuser_add_test(test_hunyuan_video15_text.cpp LABELS unit fixture)
