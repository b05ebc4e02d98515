"""Data-parallel GRPO (DDP or DeepSpeed ZeRO-3 under `accelerate launch launch/distributed.py`):
rank bookkeeping and gradient scaling, the distributed trainer, and the gradient check."""
