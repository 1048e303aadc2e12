"""Tiny randomly initialised models of every supported architecture, with real images."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch

V = 128
IMAGE_TOKEN = 100
IMAGES = Path(__file__).resolve().parent / "data" / "images"  # real photos, licences beside them


def real_image(name: str = "skimage_chelsea.png", size: int | None = None):
    from PIL import Image

    img = Image.open(IMAGES / name).convert("RGB")
    return img.resize((size, size)) if size else img


def _text(layers: int = 2, **extra):
    return dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, **extra)


@cache
def text_model(arch: str):
    import transformers

    torch.manual_seed(0)
    cfg_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForCausalLM")
    extra = {"head_dim": 16} if arch == "Gemma" else {}
    return model_cls(cfg_cls(**_text(**extra))).to(torch.float64).eval()


WINDOW = 16  # sliding-window families get a window this short, so tests run far past it
_MIXED = ["sliding_attention", "full_attention", "sliding_attention"]
_EAGER_EXPERTS = {"experts_implementation": "eager"}  # grouped GEMMs take no float64
# Text families: (config class, model class, config overrides; "layers" sets the depth).
TEXT_FAMILIES = {
    "Llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "Qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "Qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, head_dim=16)),
    "Qwen3-MoE": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16, **_EAGER_EXPERTS)),
    "Mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "Ministral": ("MinistralConfig", "MinistralForCausalLM",
                  dict(layers=3, head_dim=16, sliding_window=WINDOW, layer_types=_MIXED)),
    "Gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "Gemma 2": ("Gemma2Config", "Gemma2ForCausalLM", dict(layers=3, head_dim=16, sliding_window=WINDOW)),
    "Gemma 3 (text)": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                       dict(layers=3, head_dim=16, sliding_window=WINDOW, layer_types=_MIXED)),
    "Phi-3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "OLMo 2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "Granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "SmolLM3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(layers=4)),
    "GPT-OSS": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW, head_dim=16, **_EAGER_EXPERTS)),
    "Cohere 2": ("Cohere2Config", "Cohere2ForCausalLM", dict(layers=3, sliding_window=WINDOW, layer_types=_MIXED)),
}


@cache
def text_family(name: str):
    import transformers

    cfg_name, model_name, extra = TEXT_FAMILIES[name]
    extra = dict(extra)
    layers = extra.pop("layers", 2)
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**_text(layers, bos_token_id=0, eos_token_id=1, pad_token_id=0, **extra))
    return getattr(transformers, model_name)(cfg).to(torch.float64).eval()


@cache
def qwen25_vl(layers: int = 2, side: int = 112):
    """Images are resized to at most side x side pixels: (side / 28)^2 visual tokens."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    torch.manual_seed(0)
    cfg = Qwen2_5_VLConfig(
        text_config=_text(layers, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=64, out_hidden_size=64, intermediate_size=128, num_heads=4,
                           fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=IMAGE_TOKEN, video_token_id=101, vision_start_token_id=102, vision_end_token_id=103)
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float64).eval()
    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=side * side)
    return model, proc


def qwen25_vl_inputs(prefix: list[int], suffix: list[int], image: str = "skimage_chelsea.png", layers: int = 2,
                     side: int = 112):
    model, proc = qwen25_vl(layers, side)
    px = proc(images=[real_image(image)], return_tensors="pt")
    n = int(px["image_grid_thw"].prod()) // 4
    ids = torch.tensor([prefix + [102] + [IMAGE_TOKEN] * n + [103] + suffix])
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                       pixel_values=px["pixel_values"].to(torch.float64),
                       image_grid_thw=px["image_grid_thw"], mm_token_type_ids=(ids == IMAGE_TOKEN).long())


def _clip(image_size: int = 56):
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, image_size=image_size, patch_size=14)


@cache
def llava(layers: int = 2, image_size: int = 56):
    """(image_size / 14)^2 visual tokens."""
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    cfg = LlavaConfig(vision_config=_clip(image_size), text_config=LlamaConfig(**_text(layers)),
                      image_token_id=IMAGE_TOKEN, vision_feature_layer=-1)
    return LlavaForConditionalGeneration(cfg).to(torch.float64).eval()


def llava_inputs(prefix: list[int], suffix: list[int], image: str = "skimage_coins.png", layers: int = 2,
                 image_size: int = 56):
    model = llava(layers, image_size)
    img = np.asarray(real_image(image, image_size), dtype=np.float64) / 255.0
    px = torch.tensor(img).permute(2, 0, 1)[None]
    ids = torch.tensor([prefix + [IMAGE_TOKEN] * (image_size // 14) ** 2 + suffix])
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px)


@cache
def llava_next(layers: int = 2):
    from transformers import LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    torch.manual_seed(0)
    cfg = LlavaNextConfig(vision_config=_clip(), text_config=LlamaConfig(**_text(layers)), image_token_id=IMAGE_TOKEN,
                          image_grid_pinpoints=[[56, 56]], vision_feature_layer=-1)
    return LlavaNextForConditionalGeneration(cfg).to(torch.float64).eval()


def llava_next_inputs(prefix: list[int], suffix: list[int], image: str = "skimage_camera.png", layers: int = 2):
    model = llava_next(layers)
    img = np.asarray(real_image(image, 56), dtype=np.float64) / 255.0
    patch = torch.tensor(img).permute(2, 0, 1)
    px = torch.stack([patch, patch])[None]  # base image + one 56x56 grid tile
    sizes = torch.tensor([[56, 56]])
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=px, image_sizes=sizes)
    feats = getattr(feats, "pooler_output", feats)
    n = sum(f.shape[0] for f in feats)
    ids = torch.tensor([prefix + [IMAGE_TOKEN] * n + suffix])
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px, image_sizes=sizes)
