"""`make bench` (`python -m bench`): the standard GRPO step, engine and training throughput, tool
overhead and a multi-turn step, each against the machine's own measured peak."""
