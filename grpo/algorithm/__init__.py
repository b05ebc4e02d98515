"""The GRPO algorithm: advantages (estimators and their registry), the PPO/KL/value loss as pure
functions of tensors, the EMA reference policy, and one update step over collected trajectories."""
