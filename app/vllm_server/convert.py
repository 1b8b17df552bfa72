"""Convert a GGUF chat model into a Hugging Face checkpoint that vLLM can serve.

Runs in the vLLM virtual environment (transformers, torch and gguf come with it), never in
the app's. transformers dequantises the GGUF; the weights are then loaded into a plain
model of the same architecture (without the GGUF's quantisation config, which vLLM
would try to honour) and saved in bfloat16 with the tokenizer and its chat template.

    python app/vllm_server/convert.py MODEL.gguf OUTPUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf: Path, output: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.bfloat16().save_pretrained(output)
    tokenizer.save_pretrained(output)
    if not tokenizer.chat_template:
        raise SystemExit(f"{gguf} carries no chat template")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
