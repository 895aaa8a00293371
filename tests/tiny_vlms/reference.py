"""mlx-vlm's own generation, the reference every served vision architecture must equal: its loader,
its `prepare_inputs` on the rendered chat prompt, its `generate_step` (greedy, chunked prefill)."""

from __future__ import annotations

import io
from pathlib import Path

import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)

import mlx.core as mx
from PIL import Image


def render(processor, text: str, num_images: int) -> str:
    """A user turn with `num_images` images, then `text`, through the model's chat template."""
    content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": text}]
    tokenizer = getattr(processor, "tokenizer", processor)
    template_owner = processor if getattr(processor, "chat_template", None) else tokenizer
    return template_owner.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def mlx_vlm_greedy(
    path: Path | str,
    text: str,
    images: list[bytes],
    max_tokens: int = 16,
    prefill_step_size: int | None = None,
    loaded=None,
) -> list[int]:
    """Greedy tokens of mlx-vlm's generate_step for one user turn (EOS ignored: a fixed count)."""
    from mlx_vlm.utils import load, prepare_inputs, should_add_special_tokens

    model, processor = loaded or load(str(path))
    prompt = render(processor, text, len(images))
    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    inputs = prepare_inputs(
        processor,
        images=pictures or None,
        prompts=prompt,
        image_token_index=getattr(model.config, "image_token_index", None),
        add_special_tokens=should_add_special_tokens(model.config.model_type, processor),
    )
    extras = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values")}
    pixels = inputs.get("pixel_values")
    return generate_with_logprobs(model, inputs["input_ids"], pixels, extras, max_tokens, prefill_step_size)[
        0
    ]


def generate_with_logprobs(
    model, input_ids, pixel_values, extras: dict, max_tokens: int, prefill_step_size: int | None = None
):
    """Greedy tokens and each one's logprob, from mlx-vlm's generate_step on processed inputs (`extras`:
    the processor's other outputs, the attention mask among them). `prefill_step_size` None: one pass
    over the prompt, since mlx-vlm's chunk loop passes `inputs=` by keyword, which some of its language
    models (zaya1_vl) do not take."""
    from mlx_vlm.generate.ar import generate_step

    kwargs = dict(extras)
    mask = kwargs.pop("attention_mask", None)
    steps = generate_step(
        input_ids,
        model,
        pixel_values,
        mask,
        max_tokens=max_tokens,
        temperature=0.0,
        prefill_step_size=prefill_step_size,
        **kwargs,
    )
    pairs = [(int(token), float(logprobs[int(token)])) for token, logprobs in steps]
    mx.clear_cache()
    return [t for t, _ in pairs], [lp for _, lp in pairs]
