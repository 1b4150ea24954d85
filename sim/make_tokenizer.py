"""Train the small byte-level BPE tokenizer shipped in sim/assets/tiny-model.

Tests and the demo cannot download a model, so engine and sidecar share this one. The chat template is
ChatML (the format of Qwen2.5, the reference experiment's model). Run once; the output is committed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ASSET_DIR = Path(__file__).parent / "assets" / "tiny-model"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = (  # noqa: SIM905 - a word list reads best as running text
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more what up out about who "
    "system user assistant request engine cache prefix token model latency load balance router gateway envoy "
    "kubernetes cluster query answer document context summary question policy score matched prompt decode "
    "prefill batch running waiting memory block chunk evict admit register worker controller lookup"
).split()


def corpus(lines: int = 4000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 40))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99999)))
        out.append(" ".join(words) + rng.choice([".", "?", "!", ",", ":"]))
    return out


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def main() -> None:
    ASSET_DIR.mkdir(parents=True, exist_ok=True)
    build().save(str(ASSET_DIR / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
    }
    (ASSET_DIR / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {ASSET_DIR}")


if __name__ == "__main__":
    main()
