"""Collecting trajectories: the asyncio collector that plays groups of episodes, the batcher that
gathers their generation requests into engine calls, the token-exact chat deltas, episode records
and the collection's metrics."""
