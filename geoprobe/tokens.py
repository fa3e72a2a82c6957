"""Tokenizers for the trainable models: a backbone's, one trained on the corpus, or Text8's
27 characters. All are wrapped as `PreTrainedTokenizerFast`, so a checkpoint saves and loads
its tokenizer the same way whatever its origin."""

from __future__ import annotations

from pathlib import Path

from geoprobe.errors import BadInput

TEXT8_ALPHABET = "abcdefghijklmnopqrstuvwxyz "


def char_tokenizer():
    """Text8's vocabulary: lowercase a-z and space; anything else becomes a space."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(TEXT8_ALPHABET)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=" "))
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(Regex("[^a-z ]"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    from tokenizers import decoders

    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=" ")


TEXT8_SPLITS = {"train": (0.0, 0.9), "validation": (0.9, 0.95), "test": (0.95, 1.0)}  # 90M / 5M / 5M
TEXT8_LENGTH = 256


def is_text8(spec: str) -> bool:
    """A Text8 file: one line of lowercase a-z and spaces (checked on its first megabyte)."""
    path = Path(spec)
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        head = handle.read(1 << 20)
    return len(head) > 0 and b"\n" not in head.rstrip(b"\n") and not head.rstrip(b"\n").translate(
        None, TEXT8_ALPHABET.encode())


def text8_split(spec: str, split: str) -> tuple[str, int, int]:
    """(text, first char, end char) of a Text8 split: the usual 90% / 5% / 5% of the characters."""
    text = Path(spec).read_text().rstrip("\n")
    lo, hi = TEXT8_SPLITS[split]
    start, end = int(round(lo * len(text))), int(round(hi * len(text)))
    return text[start:end], start, end


def byte_level_bpe(documents, vocab_size: int, specials: tuple[str, ...], unk: str | None = None):
    """The project's one BPE builder: a byte-level BPE (any text tokenizes) of at most `vocab_size`
    tokens trained on the documents, `specials` first; a raw `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk) if unk else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents, trainer)
    return tok


def train_bpe(documents: list[str], vocab_size: int):
    """`--tokenizer train:V`: a byte-level BPE of `vocab_size` tokens trained on the documents (with <eos>)."""
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise BadInput(f"--tokenizer train:V needs V >= 300 (256 bytes + merges), got {vocab_size}")
    return PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(documents, vocab_size, ("<eos>",)),
                                   eos_token="<eos>")


def word_tokenizer(documents: list[str]):
    """One token per whitespace-separated word of the documents (plus <eos> and <unk>): for
    corpora with a closed vocabulary such as `synthetic:hmm`, so generations stay in it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for d in documents for w in d.split()})
    vocab = {"<eos>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", bos_token="<eos>",
                                   pad_token="<eos>")


def token_stream(documents: list[str], tokenizer) -> list[int]:
    """All documents as one id stream, each followed by the end-of-sequence token."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    return ids


def save_tokenizer(tokenizer, folder: Path) -> None:
    tokenizer.save_pretrained(folder)


def load_saved_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder)


def start_token(tokenizer, config=None) -> int | None:
    """The id a sequence starts with: the tokenizer's BOS; else the model config's bos_token_id
    where the tokenizer knows that id (Qwen3's tokenizer has no BOS; its config names
    <|endoftext|>, 151,643, the token its pretraining separates documents with); else None."""
    if tokenizer.bos_token_id is not None:
        return tokenizer.bos_token_id
    bos = getattr(config, "bos_token_id", None)
    return bos if isinstance(bos, int) and 0 <= bos < len(tokenizer) else None


def untrained_ids(tokenizer, vocab_size: int) -> range:
    """Ids of a model's vocabulary that its tokenizer never produces: a checkpoint's padding rows
    (Qwen3-8B: 151,936 rows, 151,669 tokens), never trained, so never to be sampled."""
    return range(min(len(tokenizer), vocab_size), vocab_size)


def unsampled_ids(tokenizer, vocab_size: int) -> list[int]:
    """Ids that left-to-right decoding of a fixed-length sample never draws (the `ar` row and
    `ltr` alike): EOS and the unknown token (such a sample has no end and no unknown word) and
    the checkpoint's untrained padding rows (`untrained_ids`)."""
    special = {t for t in (tokenizer.eos_token_id, tokenizer.unk_token_id) if t is not None}
    return sorted(special | set(untrained_ids(tokenizer, vocab_size)))
