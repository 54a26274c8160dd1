"""Character-level tokenizer for the embedded default.

Every printable ASCII character plus newline is one token, so any prompt (the
synthetic families or a real benchmark question) tokenizes without ``<unk>``.
It is a real ``PreTrainedTokenizerFast`` with a chat template, so prompts go
through :func:`esreason.tasks.render_prompt` exactly like a hub model's.

Chat template (our choice, documented in docs/embedded.md): ``<s>Q:{user}\\nA:``
then the assistant content and ``</s>``. System messages are dropped: the paper's
system prompts are instructions a 0.8M-parameter model cannot read, and at one
token per character they would triple the sequence length.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q:{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}A:{{ m['content'] }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character tokenizer (ids: 4 specials, then newline and ASCII 32..126)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # "." does not match "\n" in the Rust regex engine; split newline explicitly too.
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
        pre_tokenizers.Split(Regex("."), behavior="isolated"),
    ])
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        padding_side="left", clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def safe_decode(tokenizer, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Decode ids, dropping ids the vocabulary never assigned.

    A model whose embedding is larger than the vocabulary (or an untrained one)
    can sample such ids; ``convert_ids_to_tokens`` returns None for them and a
    plain ``decode`` would fail.
    """
    n = len(tokenizer)
    kept: Sequence[int] = [int(i) for i in ids if 0 <= int(i) < n]
    return tokenizer.decode(kept, skip_special_tokens=skip_special_tokens)
