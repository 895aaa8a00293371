"""The installed mlx-vlm vision architectures that no family module covers and none can build here: ones
whose processor or tower cannot be tiny or offline, and ones that generate no text. No builders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BUILDERS: dict[str, Callable[[Path, int], Path]] = {}

NOT_BUILDABLE: dict[str, str] = {
    "hunyuan_vl": "HunYuanVLProcessor hard-codes its token ids (image 120120, start/end 120118/120119, pad "
    "120002) and reads the image token string from them: a 120k-token vocabulary, not tiny",
    "ernie4_5_moe_vl": "Ernie4_5_VLProcessor.from_pretrained always builds Ernie4_5_VLTokenizer, a "
    "SentencePiece tokenizer that needs tokenizer.model; the bundled tokenizer is BPE (tokenizer.json)",
    "youtu_vl": "needs the checkpoint's remote-code processor: mlx-vlm ships none for youtu_vl and "
    "transformers 5.24 has only the text-only `youtu` model, so AutoProcessor cannot load one",
    "jina_vlm": (
        "JinaVLMProcessor builds ImageProcessor() with hard-coded defaults: 378 px crops of 14 px "
        "patches (196+ tokens per crop, plus a global crop) and image token ids 151665-151668, so "
        "the vocabulary must exceed 151k ids; nothing in the model directory configures them"
    ),
    "mistral_large3": (
        "no mlx-vlm processor is registered for model_type mistral_large3 and transformers does not "
        "know it; the PixtralProcessor its checkpoints name requires torchvision ('PixtralProcessor "
        "requires the Torchvision library but it was not found in your environment')"
    ),
    "d1_omni": "not a text generator: decision head scoring choice/score/bool questions about images or "
    "audio (Model.predict / probabilities), no token generation",
    "siglip": "not a text generator: image/text contrastive embeddings (EmbeddingOutput)",
    "sam3": "not a text generator: open-vocabulary detection boxes and segmentation masks",
    "sam3_1": "not a text generator: multiplexed segmentation masks and object tracks (SAM 3.1)",
    "sam3d_body": "not a text generator: 3D body mesh vertices, keypoints and camera parameters",
    "sam3d_objects": "not a text generator: 3D object meshes / Gaussian splats from a flow pipeline",
    "rfdetr": "not a text generator: object detection logits and boxes (optional masks)",
    "rt_detr_v2": "not a text generator: object detection logits and boxes",
    "pp_doclayout_v3": "not a text generator: document-layout boxes, class and reading-order logits",
    "embedding_gemma2": "not a text generator: multimodal embeddings (EmbeddingOutput)",
    "llama_nemotron_vl_embedding": "not a text generator: pooled image/text embeddings",
    "diffusion_gemma": "not an autoregressive generator: masked-diffusion decoding with its own "
    "diffusion_* unmasking loop, not generate_step",
    "moss_image": "not a text generator: text-to-image diffusion pipeline (MOSS-Image), no mlx-vlm Model",
}
