"""grpo/forward/common_prefix.py: the prefix every row of a pass shares runs once per pass and model,
and the pass computes what running it in every micro-batch computes (log-probs, values, gradients)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from test_policy import _assert_grad_close, _policy
from update_helpers import make_settings, sgd

from grpo.algorithm.config import ReferenceConfig
from grpo.algorithm.reference import make_reference
from grpo.algorithm.scoring import common_prefix_for, score
from grpo.algorithm.update import train_step
from grpo.forward.common_prefix import CommonPrefix, common_prefix_length, leading_prefix_length
from grpo.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_thread")


def test_common_prefix_length_and_the_prefix_a_pass_shares():
    assert common_prefix_length([[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 4]]) == 3
    assert common_prefix_length([[7, 1], [8, 1]]) == 0
    assert common_prefix_length([]) == 0
    assert common_prefix_length([(1, 2, 3), [1, 2, 4]]) == 2  # a tuple and a list: compared by token
    assert leading_prefix_length([[1, 2, 3, 4, 5], [1, 2, 3, 9]]) == 3
    assert leading_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter one keeps its last token
    assert leading_prefix_length([[1, 2], []]) == 0
    assert leading_prefix_length([]) == 0
    assert CommonPrefix.of([[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 4]], min_tokens=2).token_ids.tolist() == [1, 2, 3]
    # Every row keeps a column of its own: identical rows share all but their last token.
    assert CommonPrefix.of([[1, 2, 3], [1, 2, 3]], min_tokens=2).token_ids.tolist() == [1, 2]
    assert CommonPrefix.of([[1, 2, 3, 4, 5], [1, 2, 3, 9]], min_tokens=4) is None  # shorter than the minimum
    assert CommonPrefix.of([[1, 2, 3], [1, 2, 3]], min_tokens=0) is None  # 0: never share
    with pytest.raises(ValueError, match="at least one token"):
        CommonPrefix([])
    used = CommonPrefix([4, 5])
    used._finishing = True
    other = used.fresh()  # another model's: the same tokens, nothing computed
    assert other is not used and other.token_ids.tolist() == [4, 5]
    assert other._live is None and other._leaves is None and not other._finishing


def test_a_batch_that_does_not_start_with_the_prefix_is_refused():
    prefix = CommonPrefix([5, 6, 7])
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 7, 2]])
    prefix.check(ids, torch.ones_like(ids))  # fine
    with pytest.raises(ValueError, match=r"shape \(2, 4\) does not start with the common prefix of 3 tokens"):
        prefix.check(torch.tensor([[5, 6, 7, 1], [5, 9, 7, 2]]), torch.ones_like(ids))
    padded = torch.ones_like(ids)
    padded[1, 2] = 0
    with pytest.raises(ValueError, match="common prefix of 3 tokens"):
        prefix.check(ids, padded)
    with pytest.raises(ValueError, match="common prefix of 3 tokens"):  # nothing after the prefix
        prefix.check(ids[:, :3], torch.ones(2, 3, dtype=torch.long))


TEMPLATE = torch.randint(0, 2000, (24,), generator=torch.Generator().manual_seed(11)).tolist()


def _rows(seed: int, count: int, group_prompt: int = 6, tail: int = 8) -> list[list[int]]:
    """`count` rows: the template, a prompt shared by pairs of rows, then tokens of their own."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for row in range(count):
        if row % 2 == 0:
            prompt = torch.randint(0, 2000, (group_prompt,), generator=gen).tolist()
        out.append(TEMPLATE + prompt + torch.randint(0, 2000, (tail + row % 3,), generator=gen).tolist())
    return out


def _batch(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(map(len, rows))
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    return ids, mask


def _prefix_calls(policy, calls: list | None = None) -> list[tuple[int, int]]:
    """Records in `calls` (rows, columns) of every decoder call that starts at position 0."""
    calls = [] if calls is None else calls

    def hook(module, args, kwargs):
        if int(kwargs["position_ids"][0, 0]) == 0:
            calls.append(tuple(kwargs["input_ids"].shape))

    policy.language_model().get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
    return calls


@pytest.mark.parametrize("lora", [False, True])
def test_a_pass_runs_the_prefix_once_and_scores_what_each_micro_batch_would(lora):
    policy = _policy(lora=lora)
    policy.segment_call_tokens = 4
    policy.eval()
    batches = [_batch(_rows(0, 4)), _batch(_rows(1, 3))]
    calls = _prefix_calls(policy)
    with torch.no_grad():
        want = [policy(ids, mask, with_entropy=True, with_values=True) for ids, mask in batches]
        assert len(calls) == 2  # each micro-batch ran the template once, as its first segment
        prefix = policy.common_prefix(_rows(0, 4) + _rows(1, 3))
        assert len(prefix) == 24
        got = [policy(ids, mask, with_entropy=True, with_values=True, prefix=prefix) for ids, mask in batches]
    assert calls[2:] == [(1, 24)]  # then once for both
    for (ids, mask), g, w in zip(batches, got, want, strict=True):
        valid = mask[:, 1:].bool()
        torch.testing.assert_close(g.logprobs[valid], w.logprobs[valid], atol=1e-5, rtol=0)
        torch.testing.assert_close(g.entropy[valid], w.entropy[valid], atol=1e-5, rtol=0)
        torch.testing.assert_close(g.values[valid], w.values[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("lora", [False, True])
def test_micro_batches_sharing_a_prefix_get_the_gradients_of_running_it_each(lora):
    policy = _policy(lora=lora)
    policy.segment_call_tokens = 4
    batches = [_batch(_rows(0, 4)), _batch(_rows(1, 3)), _batch(_rows(2, 2))]
    params = policy.trainable_parameters()

    def weighted(out, mask):
        weights = torch.arange(float(mask.shape[1] - 1)).expand(mask.shape[0], -1) * mask[:, 1:]
        return (out.logprobs * weights).sum() + (out.values * mask[:, 1:]).sum()

    def gradients(prefix):
        policy.zero_grad(set_to_none=True)
        for index, (ids, mask) in enumerate(batches):
            last = index == len(batches) - 1
            if prefix is not None and last:
                prefix.finish()
            loss = weighted(policy(ids, mask, with_values=True, prefix=prefix), mask)
            carried = prefix.carried_loss() if prefix is not None and last else None
            (loss if carried is None else loss + carried).backward()
        return [p.grad.clone() for p in params if p.grad is not None]

    want = gradients(None)
    calls = _prefix_calls(policy)
    got = gradients(policy.common_prefix(_rows(0, 4) + _rows(1, 3) + _rows(2, 2)))
    assert calls == [(1, 24)]
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        _assert_grad_close(g, w)


def _trajectories(policy, rows: list[list[int]], rewards: list[float]) -> list[Trajectory]:
    """Pairs of rows are groups; the tokens after the template and group prompt are sampled."""
    out = []
    for r, (ids, reward) in enumerate(zip(rows, rewards, strict=True)):
        mask = [0] * 30 + [1] * (len(ids) - 30)
        with torch.no_grad():
            lp = policy(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)).logprobs[0]
        behavior = [0.0] + [float(lp[i - 1]) if mask[i] else 0.0 for i in range(1, len(ids))]
        out.append(Trajectory(task_id=f"t{r // 2}", group_id=f"g{r // 2}", token_ids=ids, loss_mask=mask,
                              behavior_logprobs=behavior, prompt_length=30, reward=reward))
    return out


@pytest.mark.parametrize("lora", [False, True])
def test_scoring_runs_each_models_prefix_once_under_its_own_weights(lora):
    policy = _policy(lora=lora)
    reference = make_reference(policy, ReferenceConfig())
    with torch.no_grad():  # the reference now differs from the policy
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    trajectories = _trajectories(policy, _rows(5, 8), [1.0, 0.0] * 4)
    rows = list(range(8))
    assert common_prefix_for(policy, trajectories, rows, micro_batch_count=1) is None
    assert len(common_prefix_for(policy, trajectories, rows, micro_batch_count=2)) == 24

    def scores(micro_batch_size):
        return score(policy, reference, trajectories, rows, want_old=True, want_values=True,
                     micro_batch_size=micro_batch_size, pad_token_id=0, temperature=1.0, seconds=defaultdict(float))

    whole = scores(8)  # one micro-batch: no common prefix
    calls = _prefix_calls(policy)
    if not lora:  # a model of its own
        _prefix_calls(reference.model, calls)
    split = scores(2)  # four micro-batches
    assert sorted(calls) == [(1, 24), (1, 24)]  # once for the policy, once for the reference
    for field in ("old", "values", "ref"):
        for i in rows:
            torch.testing.assert_close(getattr(split, field)[i], getattr(whole, field)[i], atol=1e-5, rtol=0)
    assert not torch.allclose(split.ref[0], split.old[0])  # the reference scored under its own weights


def test_an_update_over_micro_batches_sharing_a_prefix_gets_the_gradients_it_gets_without():
    gradients = []
    for share in (16, 0):  # 0: no prefix is shared, within or across micro-batches
        policy = _policy()
        policy.share_prefix_min = share
        reference = make_reference(policy, ReferenceConfig())
        trajectories = _trajectories(policy, _rows(7, 8), [1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.2, 0.9])
        with torch.no_grad():  # the reference now differs from the policy: the KL term pulls
            for p in policy.trainable_parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        calls, ref_calls = _prefix_calls(policy), _prefix_calls(reference.model)
        optimizer, scheduler = sgd(policy)
        metrics = train_step(policy, reference, optimizer, scheduler, trajectories,
                             make_settings(micro_batch_size=3, loss={"kl_coef": 0.5}))
        assert metrics["train/kl_ref"] > 0
        # Shared: the template once per pass and model. Not: three micro-batches, each packed
        # into one row (grpo/forward/prefix_tree.py), for the reference and again for the update.
        assert calls == ref_calls == ([(1, 24)] if share else [(1, 66), (1, 69), (1, 56)])
        gradients.append([p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None])
    for got, want in zip(*gradients, strict=True):
        _assert_grad_close(got, want)
