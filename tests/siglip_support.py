"""A tiny random-init Hugging Face `SiglipModel` with a word-level tokenizer, saved to a folder: nothing
downloaded. The tokenizer appends `</s>` and pads with `<pad>`, as SigLIP's sentencepiece tokenizer does."""

from pathlib import Path

import torch

WORDS = ("a", "an", "the", "red", "green", "blue", "yellow", "pink", "cyan", "small", "large", "square", "circle",
         "star", "triangle", "cross", "left", "right", "of", "above", "below", "and", "number", "thing", "photo")


def write_tiny_siglip(folder: Path, seed: int = 0) -> Path:
    """Save a 2-layer, width-32 `SiglipModel` (32-pixel images, 16-token captions) and its tokenizer to `folder`."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{word: 3 + i for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                                     unk_token="<unk>", model_max_length=16)
    tokenizer.save_pretrained(folder)
    layers = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = transformers.SiglipConfig(
        text_config={**layers, "vocab_size": len(vocab), "max_position_embeddings": 16, "pad_token_id": 0,
                     "bos_token_id": 1, "eos_token_id": 1, "projection_size": 32},
        vision_config={**layers, "image_size": 32, "patch_size": 8},
    )
    torch.manual_seed(seed)
    model = transformers.SiglipModel(config)
    with torch.no_grad():  # SigLIP's initial temperature and bias (transformers initialises both at 0)
        model.logit_scale.fill_(torch.log(torch.tensor(10.0)))
        model.logit_bias.fill_(-10.0)
    model.save_pretrained(folder)
    return folder


def write_local_open_clip_siglip(folder: Path, seed: int = 0) -> Path:
    """An open_clip `local-dir:` folder of a tiny SigLIP-style model: `open_clip_config.json` (a custom text
    tower without causal mask pooling the last token, `init_logit_bias`, a Hugging Face tokenizer), the
    weights, and the tokenizer files of `write_tiny_siglip`, which open_clip then reads from the folder."""
    import json

    import open_clip
    from safetensors.torch import save_file

    write_tiny_siglip(folder, seed)
    for name in ("model.safetensors", "config.json"):
        (folder / name).unlink()
    model_cfg = {"embed_dim": 32, "init_logit_bias": -10, "custom_text": True,
                 "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
                 "text_cfg": {"context_length": 16, "vocab_size": 3 + len(WORDS), "width": 32, "heads": 2,
                              "layers": 2, "hf_tokenizer_name": "lace-tests/tiny-siglip", "no_causal_mask": True,
                              "proj_bias": True, "pool_type": "last"}}
    (folder / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": model_cfg, "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3}}))
    torch.manual_seed(seed)
    model = open_clip.model.CustomTextCLIP(**{k: v for k, v in model_cfg.items() if k != "custom_text"})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder
