"""A prompt's ids are the vocabulary's shared int objects: a held request keeps no int object of its own."""

from __future__ import annotations

import gc
import sys

from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from loadaware.tokenize.conversation import ConversationTokens
from loadaware.tokenize.shared_ids import SharedIds
from loadaware.tokenize.tokenizer import PromptTokenizer, id_space
from testkit.paths import REPO

TINY = str(REPO / "sim" / "assets" / "tiny-model")


def test_shared_ids_are_the_tables_objects_and_an_id_outside_the_vocabulary_is_kept() -> None:
    shared = SharedIds(5000)
    a, b = shared([int("4321"), 1000]), shared([int("4321")])
    assert a == [4321, 1000] and a[0] is b[0] is shared[4321]
    assert shared([4999, 5000]) == [4999, 5000]  # 5000 is outside: the ids come back as they were


def long_prompt(n: int) -> str:
    return " ".join(f"paragraph{i % 97} talks about engines caches tokens routers {i}" for i in range(n))


def test_every_id_of_an_encoded_prompt_is_shared_cached_pieces_and_fresh_tail_alike() -> None:
    tokenizer = PromptTokenizer(TINY)
    text = long_prompt(200)
    first, _second, third = (tokenizer.encode_prompt(text + f" question {q}") for q in range(3))
    assert tokenizer.pieces.hits > 0  # the third came mostly from cached pieces
    assert first[:100] == third[:100] and sum(i > 256 for i in third) > len(third) // 4
    # equal ids are the same objects: no int made for this prompt
    assert all(x is y for x, y in zip(first, third) if x == y)
    # ... and those of a whole encode (no piece cache) are the table's too
    assert all(x is tokenizer.shared[x] for x in tokenizer.encode_exact(text))


def test_held_prompts_add_no_python_object_a_token() -> None:
    tokenizer = PromptTokenizer(TINY)
    text = long_prompt(200)
    for _ in range(2):
        tokenizer.encode_prompt(text)  # its pieces cached
    gc.collect()
    before = sys.getallocatedblocks()
    held = [tokenizer.encode_prompt(text + f" question {q}") for q in range(50)]
    gc.collect()
    per_token = (sys.getallocatedblocks() - before) / sum(len(ids) for ids in held)
    print(f"Python blocks a held token: {per_token:.4f}")
    assert per_token < 0.05  # a list's own blocks and a few fresh tail ids; an int a token would be ~0.6 here


def test_a_conversation_hits_ids_are_shared_too() -> None:
    tokenizer = PromptTokenizer(TINY)
    conversations = ConversationTokens(tokenizer)
    turns = [{"role": "user", "content": long_prompt(30)}]
    conversations.encode(turns)
    turns += [{"role": "assistant", "content": "noted " * 20}, {"role": "user", "content": "and then?"}]
    prep = conversations.prepare(turns, None)
    assert prep.hit is not None and len(prep.hit.ids) > 100
    assert all(x is tokenizer.shared[x] for x in prep.hit.ids)


def test_the_table_covers_added_tokens_past_the_vocabulary() -> None:
    tokenizer = Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.add_special_tokens(["<s>", "</s>"])
    assert id_space(tokenizer) == 5 == tokenizer.get_vocab_size(with_added_tokens=True)
    assert id_space(Tokenizer(WordLevel({"a": 0, "z": 9}, unk_token="a"))) == 10  # a gap: one past the largest
