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


_QWEN_VL = {  # family: (config class, model class, patch size, extra text and vision settings)
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", 14, {},
                 dict(embed_dim=32, hidden_size=64, mlp_ratio=2)),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", 14, {},
                   dict(hidden_size=64, out_hidden_size=64, intermediate_size=128, fullatt_block_indexes=[1])),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", 16, dict(head_dim=16),
                 dict(hidden_size=64, out_hidden_size=64, intermediate_size=128, deepstack_visual_indexes=[1],
                      num_position_embeddings=64)),
}


@cache
def qwen_vl(family: str = "qwen2_5_vl", layers: int = 2, side: int = 112):
    """Images are resized to at most side x side pixels: (side / (2 x patch))^2 visual tokens."""
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    cfg_name, model_name, patch, text_extra, vision_extra = _QWEN_VL[family]
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
    if family == "qwen3_vl":
        rope["mrope_interleaved"] = True
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(
        text_config=_text(layers, bos_token_id=0, eos_token_id=1, pad_token_id=2, rope_parameters=rope, **text_extra),
        vision_config=dict(depth=2, num_heads=4, patch_size=patch, spatial_merge_size=2, temporal_patch_size=2,
                           **vision_extra),
        image_token_id=IMAGE_TOKEN, video_token_id=101, vision_start_token_id=102, vision_end_token_id=103)
    model = getattr(transformers, model_name)(cfg).to(torch.float64).eval()
    side = side * patch // 14
    proc = Qwen2VLImageProcessorPil(min_pixels=(4 * patch) ** 2, max_pixels=side * side, patch_size=patch)
    return model, proc


def qwen_vl_inputs(prefix: list[int], suffix: list[int], image: str = "skimage_chelsea.png", layers: int = 2,
                   side: int = 112, family: str = "qwen2_5_vl"):
    model, proc = qwen_vl(family, layers, side)
    px = proc(images=[real_image(image)], return_tensors="pt")
    n = int(px["image_grid_thw"].prod()) // 4
    ids = torch.tensor([prefix + [102] + [IMAGE_TOKEN] * n + [103] + suffix])
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                       pixel_values=px["pixel_values"].to(torch.float64),
                       image_grid_thw=px["image_grid_thw"], mm_token_type_ids=(ids == IMAGE_TOKEN).long())


def qwen25_vl_inputs(prefix: list[int], suffix: list[int], image: str = "skimage_chelsea.png", layers: int = 2,
                     side: int = 112):
    return qwen_vl_inputs(prefix, suffix, image, layers, side, "qwen2_5_vl")


def _square_pixels(image: str, size: int) -> torch.Tensor:
    """[1, 3, size, size] float64 in [0, 1]: the real image resized."""
    img = np.asarray(real_image(image, size), dtype=np.float64) / 255.0
    return torch.tensor(img).permute(2, 0, 1)[None]


def _siglip(image_size: int = 56):
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              image_size=image_size, patch_size=14)


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
    px = _square_pixels(image, image_size)
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
    return _tiled_inputs(llava_next(layers), prefix, suffix, image)


def _tiled_inputs(model, prefix: list[int], suffix: list[int], image: str):
    """LLaVA-NeXT / OneVision: the base image plus one 56x56 grid tile; the placeholder count
    is what the model's own feature extractor yields (tiles, newlines)."""
    patch = _square_pixels(image, 56)[0]
    px = torch.stack([patch, patch])[None]
    sizes = torch.tensor([[56, 56]])
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=px, image_sizes=sizes)
    feats = getattr(feats, "pooler_output", feats)
    n = sum(f.shape[0] for f in feats)
    ids = torch.tensor([prefix + [IMAGE_TOKEN] * n + suffix])
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px, image_sizes=sizes)


@cache
def llava_onevision():
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config

    torch.manual_seed(0)
    cfg = LlavaOnevisionConfig(vision_config=_siglip().to_dict(), text_config=Qwen2Config(**_text()).to_dict(),
                               image_token_id=IMAGE_TOKEN, video_token_id=101, image_grid_pinpoints=[[56, 56]],
                               vision_feature_layer=-1)
    return LlavaOnevisionForConditionalGeneration(cfg).to(torch.float64).eval()


def llava_onevision_inputs(prefix: list[int], suffix: list[int]):
    return _tiled_inputs(llava_onevision(), prefix, suffix, "skimage_camera.png")


@cache
def gemma3_vl():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    text = _text(3, head_dim=16, sliding_window=WINDOW, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                 layer_types=_MIXED)
    cfg = Gemma3Config(text_config=text, vision_config=_siglip().to_dict(), mm_tokens_per_image=4,
                       image_token_id=IMAGE_TOKEN, boi_token_index=102, eoi_token_index=103)
    return Gemma3ForConditionalGeneration(cfg).to(torch.float64).eval()


def gemma3_vl_inputs(prefix: list[int], suffix: list[int]):
    ids = torch.tensor([prefix + [102] + [IMAGE_TOKEN] * 4 + [103] + suffix])
    return gemma3_vl(), dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                             pixel_values=_square_pixels("skimage_coins.png", 56),
                             token_type_ids=(ids == IMAGE_TOKEN).long())


@cache
def idefics3():
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, LlamaConfig

    torch.manual_seed(0)
    cfg = Idefics3Config(vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, image_size=56, patch_size=14),
                         text_config=LlamaConfig(**_text()).to_dict(), image_token_id=IMAGE_TOKEN, scale_factor=2)
    return Idefics3ForConditionalGeneration(cfg).to(torch.float64).eval()


def idefics3_inputs(prefix: list[int], suffix: list[int]):
    ids = torch.tensor([prefix + [IMAGE_TOKEN] * 4 + suffix])  # (56 / 14)^2 patches, pixel-shuffled by 2
    return idefics3(), dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                            pixel_values=_square_pixels("skimage_coins.png", 56)[None],
                            pixel_attention_mask=torch.ones(1, 1, 56, 56, dtype=torch.bool))


@cache
def internvl():
    from transformers import InternVLConfig, InternVLForConditionalGeneration, Qwen2Config

    torch.manual_seed(0)
    cfg = InternVLConfig(vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, image_size=[56, 56], patch_size=[14, 14]),
                         text_config=Qwen2Config(**_text()).to_dict(), image_token_id=IMAGE_TOKEN,
                         downsample_ratio=0.5, image_seq_length=4)
    return InternVLForConditionalGeneration(cfg).to(torch.float64).eval()


def internvl_inputs(prefix: list[int], suffix: list[int]):
    ids = torch.tensor([prefix + [102] + [IMAGE_TOKEN] * 4 + [103] + suffix])
    return internvl(), dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                            pixel_values=_square_pixels("skimage_chelsea.png", 56))


@cache
def mistral3():
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    torch.manual_seed(0)
    vision = PixtralVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=56, patch_size=14, head_dim=16)
    text = MistralConfig(**_text(sliding_window=WINDOW, head_dim=16))
    cfg = Mistral3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_id=IMAGE_TOKEN,
                         spatial_merge_size=2, vision_feature_layer=-1)
    return Mistral3ForConditionalGeneration(cfg).to(torch.float64).eval()


def mistral3_inputs(prefix: list[int], suffix: list[int]):
    ids = torch.tensor([prefix + [IMAGE_TOKEN] * 4 + suffix])  # a 2x2 grid of merged patches
    return mistral3(), dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                            pixel_values=_square_pixels("skimage_camera.png", 56), image_sizes=torch.tensor([[56, 56]]))


# Vision-language families: name -> inputs(prefix, suffix) giving (model, generate inputs) with a real image.
VLM_FAMILIES = {
    "Qwen2-VL": lambda p, s: qwen_vl_inputs(p, s, family="qwen2_vl"),
    "Qwen2.5-VL": lambda p, s: qwen_vl_inputs(p, s, family="qwen2_5_vl"),
    "Qwen3-VL": lambda p, s: qwen_vl_inputs(p, s, family="qwen3_vl"),
    "LLaVA": lambda p, s: llava_inputs(p, s),
    "LLaVA-NeXT": lambda p, s: llava_next_inputs(p, s),
    "LLaVA-OneVision": llava_onevision_inputs,
    "Gemma 3": gemma3_vl_inputs,
    "Idefics3 / SmolVLM": idefics3_inputs,
    "InternVL": internvl_inputs,
    "Mistral 3": mistral3_inputs,
}
