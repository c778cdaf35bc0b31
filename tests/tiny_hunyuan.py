"""A tiny random-weight HunyuanOCR (``HunYuanVLForConditionalGeneration``) built offline for tests.

The real architecture classes of transformers (>= 5.13, the first with ``hunyuan_vl``) at toy sizes:
2 + 2 layers, hidden 64 / 32, text head size 16 (or 32), about 190 k parameters, float32. The
tokenizer is byte-level BPE without merges (256 byte tokens plus HunyuanOCR's special-token
names), the image processor the PIL one at the registry's pixel bounds (512^2 .. 4096^2 px), and
the chat template renders the prompt HunyuanOCR publishes (vLLM example
``f"{BOS}{IMG_START}{IMG}{IMG_END}{question}<｜hy_User｜>"``).
The EOS token and the template are reconstructions (no real checkpoint file is read); the field
names are the real checkpoint's (its full-size config gives the registry's 996,208,112 params).

Nothing is downloaded. With seed 0 the random model degenerates deterministically: it repeats
``<｜hy_User｜>`` (decoded to ``""`` with ``skip_special_tokens``), or with ``looping=True``
(special tokens suppressed in ``generation_config.json``) a printable character, for ever.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    HunYuanVLConfig,
    HunYuanVLForConditionalGeneration,
    HunYuanVLImageProcessorPil,
    HunYuanVLProcessor,
    PreTrainedTokenizerFast,
)

from ocrserve.models import get_model

SPEC = get_model("tencent/HunyuanOCR")
BOS = "<｜hy_begin▁of▁sentence｜>"
EOS = "<｜hy_place▁holder▁no▁2｜>"  # a stand-in for the real end token
PAD = "<｜hy_▁pad▁｜>"
USER = "<｜hy_User｜>"
ASSISTANT = "<｜hy_Assistant｜>"
SYS_END = "<｜hy_place▁holder▁no▁3｜>"
IMG_START = "<｜hy_place▁holder▁no▁100｜>"
IMG_END = "<｜hy_place▁holder▁no▁101｜>"
IMG = "<｜hy_place▁holder▁no▁102｜>"
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT, SYS_END, IMG_START, IMG_END, IMG]

#: bos, the system text (+ no_3 once a system turn is given, even an empty one), the user turn with
#: the image as start/image/end placeholders, then <｜hy_User｜> as the generation prompt.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for c in message['content'] -%}{{- c['text'] -}}{%- endfor -%}{%- endif -%}"
    "{{- '" + SYS_END + "' -}}"
    "{%- elif message['role'] == 'user' -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for c in message['content'] -%}"
    "{%- if c['type'] == 'image' or c['type'] == 'image_url' -%}"
    "{{- '" + IMG_START + IMG + IMG_END + "' -}}"
    "{%- elif c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if loop.last and add_generation_prompt -%}{{- '" + USER + "' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '" + USER + "' -}}{{- message['content'] -}}{{- eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: one token per byte, then the special tokens (ids 256..264)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens={"image_token": IMG, "image_start_token": IMG_START, "image_end_token": IMG_END},
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def build_config(tokenizer: PreTrainedTokenizerFast, head_dim: int = 16) -> HunYuanVLConfig:
    """HunyuanOCR's config at toy sizes (the real values in comments); ``head_dim``: the text
    attention's head size (see :func:`build_tiny_hunyuan`)."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    # 4 rope axes (position, width, height, image) summing to head_dim / 2 (real: [16] * 4)
    section = [head_dim // 8] * 4
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,  # real: 1024
        "intermediate_size": 128,  # real: 3584
        "num_hidden_layers": 2,  # real: 24
        "num_attention_heads": 4,  # real: 16
        "num_key_value_heads": 2,  # real: 8
        "head_dim": head_dim,  # real: 128
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        # the checkpoint's spelling: xdrope -> NTK-alpha rope; transformers requires `factor`
        "rope_parameters": {
            "rope_type": "xdrope",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
            "xdrope_section": section,
        },
        "tie_word_embeddings": True,
        "pad_token_id": ids[PAD],
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "eod_token_id": ids[EOS],
        "sep_token_id": ids[SYS_END],
    }
    vision_config = {
        "hidden_size": 32,  # real: 1152
        "intermediate_size": 64,  # real: 4304
        "num_hidden_layers": 2,  # real: 27
        "num_attention_heads": 2,  # real: 16
        "patch_size": SPEC.patch_size,
        "spatial_merge_size": SPEC.merge_size,
        "temporal_patch_size": 1,
        "max_image_size": 512,  # sizes the learned position grid, interpolated to any page
        "min_image_size": 512,
        "out_hidden_size": 64,
        "text_hidden_size": 64,
        "max_vit_seq_len": 16384,
        "img_max_token_num": 16384,
    }
    return HunYuanVLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids[IMG],
        im_start_id=ids[IMG_START],
        im_end_id=ids[IMG_END],
        im_newline_id=ids[IMG],  # unused by transformers: the row newline is a learned vector
        tie_word_embeddings=True,
    )


def build_tiny_hunyuan(out_dir: str | Path, *, looping: bool = False, head_dim: int = 16) -> Path:
    """Save the tiny model, its tokenizer and processor to ``out_dir`` (about 0.1 s) and return it.

    Args:
        looping: suppress every special token but EOS in ``generation_config.json``, so that greedy
            decoding repeats a printable character instead of an (invisible) special token.
        head_dim: the text attention's head size; 32 for vLLM's CPU build (``tests/real_vllm.py``),
            whose attention has kernels for 32, 64, ... but not 16 (a model with 16 starts, then
            its first request kills the engine). The rope sections follow (head_dim / 8 each);
            transformers saves them as ``mrope_section``, the spelling vLLM reads.
    """
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    image_processor = HunYuanVLImageProcessorPil(min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    processor = HunYuanVLProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    model = HunYuanVLForConditionalGeneration(build_config(tokenizer, head_dim))
    if looping:
        model.generation_config.suppress_tokens = [
            i for i in tokenizer.added_tokens_decoder if i != tokenizer.eos_token_id
        ]
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return Path(out_dir)
