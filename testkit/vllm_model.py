"""Write the tiny random-weight Llama that the real-vLLM tier and demo serve (no download anywhere).

Run with the vLLM venv's interpreter (it needs torch and transformers), from the repository root:
`python -m testkit.vllm_model OUT_DIR`.
Seeded, so every run writes the same weights; the tokenizer and chat template are the project's own
(sim/assets/tiny-model), so the sidecar and the engine tokenize alike. The shape follows what vLLM's CPU
attention accepts: head_dim 64 (hidden 128 over 2 heads; 16 fails at the first request), one KV head.
Standard library plus torch/transformers only: no project imports, so any interpreter with those two runs it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "sim" / "assets" / "tiny-model"
SEED = 1234
MAX_POSITIONS = 4096
# Changing any value here changes the model: the launcher compares this stamp before reusing a written model.
SHAPE: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "max_position_embeddings": MAX_POSITIONS}
STAMP_FILE = "loadaware-model.json"
LORA_DIR = "tiny-lora"  # a LoRA adapter of the model (rank 8 on q_proj and v_proj), inside the model's folder
LORA_RANK = 8


def stamp() -> dict[str, object]:
    return {"seed": SEED, "lora_rank": LORA_RANK, **SHAPE}


def write_lora(out_dir: Path) -> None:
    """A PEFT-format adapter with seeded random weights: what `--lora-modules NAME=DIR` loads."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(SEED + 1)
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    outputs = {"q_proj": SHAPE["num_attention_heads"] * head_dim, "v_proj": SHAPE["num_key_value_heads"] * head_dim}
    tensors = {}
    for layer in range(SHAPE["num_hidden_layers"]):
        for module, out_features in outputs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn(LORA_RANK, SHAPE["hidden_size"], generator=generator)
            tensors[f"{prefix}.lora_A.weight"] = a * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, LORA_RANK, generator=generator) * 0.01
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": 16, "lora_dropout": 0.0,
        "bias": "none", "target_modules": list(outputs), "base_model_name_or_path": "tiny-llama"}))


def write_model(out_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    vocab_size = len(tokenizer["model"]["vocab"]) + sum(
        1 for t in tokenizer.get("added_tokens", []) if t["content"] not in tokenizer["model"]["vocab"])
    tok_config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    eos = tok_config.get("eos_token")
    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=vocab_size, head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                         tie_word_embeddings=True,
                         eos_token_id=vocab.get(eos) if eos else None, bos_token_id=None, **SHAPE)
    model = LlamaForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / name, out_dir / name)
    write_lora(out_dir / LORA_DIR)
    (out_dir / STAMP_FILE).write_text(json.dumps(stamp(), sort_keys=True))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm_model.py OUT_DIR", file=sys.stderr)
        return 2
    write_model(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
