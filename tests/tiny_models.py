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
