"""The ``tiny`` built-in: a random tiny Qwen2 and a character-level tokenizer, built from code (no downloads).

Neighbours: ``models.resolve`` builds it through ``cache.ensure``; tests and the tiny examples use it because a
vLLM engine starts on it quickly and the copy task is learnable by it in minutes.

Invariants:
- Deterministic: the weights are a pure function of :data:`SEED` and :func:`config` (CPU init under a fixed
  seed), so every process on every machine gets the same model; bump :data:`VERSION` when anything here changes.
- head_dim is 64 (vLLM's CPU attention needs >= 32); the vocabulary (259 tokens) is padded to
  :data:`VOCAB_SIZE` embedding rows.
- Embeddings are tied (``lm_head`` shares the embedding matrix), exercising the tied-weight path of weight sync.
- One token per byte, so one per ASCII character (letters, digits, space, ``+-*=?:``, newline, ...);
  ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2, byte ``b`` = ``3 + b``. No chat template: tiny prompts are plain text.
"""
from __future__ import annotations

import pathlib

import tokenizers
import torch
import transformers
from tokenizers import decoders, normalizers, pre_tokenizers

VERSION = "v2"
NAME = f"tiny-{VERSION}"
SEED = 1234
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIALS = (PAD, EOS, UNK)
VOCAB_SIZE = 288
MAX_POSITIONS = 512


def byte_alphabet() -> list[str]:
    """The byte-level alphabet: the printable character standing for each byte value 0..255.

    Bytes that are visible Latin-1 characters stand for themselves; the others (controls, space, ...) are
    shifted to code points from 256 upwards, in byte order (the convention of byte-level BPE tokenizers).
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out: list[str] = []
    for b in range(256):
        out.append(chr(b) if b in visible else chr(256 + sum(1 for x in range(b) if x not in visible)))
    return out


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens first, then byte ``b`` as id ``len(SPECIALS) + b``."""
    return {t: i for i, t in enumerate(list(SPECIALS) + byte_alphabet())}


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE without merges: one token per byte, hence one per ASCII character.

    It has the byte-level BPE shape (vocabulary spelled in byte-level characters, no merges) because
    ``AutoTokenizer`` (hence vLLM) loads any ``qwen2`` folder's tokenizer as ``Qwen2Tokenizer``, which keeps only
    the vocabulary and merges of ``tokenizer.json``: with this shape both loaders split text identically.
    """
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocabulary(), merges=[], unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, model_max_length=MAX_POSITIONS)


def config() -> transformers.Qwen2Config:
    """The architecture: 2 layers, hidden 128, 2 heads of 64, tied embeddings, fp32."""
    voc = vocabulary()
    return transformers.Qwen2Config(  # type: ignore[call-arg]
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, initializer_range=0.02, rms_norm_eps=1e-6,
        bos_token_id=voc[EOS], eos_token_id=voc[EOS], pad_token_id=voc[PAD], dtype="float32",
    )


def build(target: pathlib.Path) -> None:
    """Write the model and tokenizer into ``target`` (a cache builder)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = transformers.Qwen2ForCausalLM(config())  # type: ignore[no-untyped-call]
    model.save_pretrained(target, safe_serialization=True)
    cfg = model.config
    transformers.GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
    ).save_pretrained(target)
    tokenizer().save_pretrained(target)
