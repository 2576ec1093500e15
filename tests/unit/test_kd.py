"""KD losses against values computed by hand with Python's math module (no torch in the reference)."""
from __future__ import annotations

import math

import pytest
import torch

from synapse.engine import training_loss
from synapse.kd import KD_MODES, KDLossParams, kd_loss, logits_kd, soft_target_kd

STUDENT = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
TEACHER = [[2.0, 0.0, 1.0], [1.0, 1.0, -2.0]]
LABELS = [1, 2]


# ----------------------------------------------------------------------------- hand-computed references

def softmax(row: list[float], T: float = 1.0) -> list[float]:
    scaled = [x / T for x in row]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    return [e / sum(exps) for e in exps]


def kl_divergence(p: list[float], q: list[float]) -> float:
    """KL(p || q) = sum_i p_i log(p_i / q_i)."""
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def hand_soft_target(student: list[list[float]], teacher: list[list[float]], T: float) -> float:
    """T^2 times the batch mean of KL(softmax(t / T) || softmax(s / T))."""
    kls = [kl_divergence(softmax(t, T), softmax(s, T)) for s, t in zip(student, teacher)]
    return T * T * sum(kls) / len(kls)


def hand_cross_entropy(student: list[list[float]], labels: list[int]) -> float:
    return sum(-math.log(softmax(s)[y]) for s, y in zip(student, labels)) / len(labels)


def hand_mse(student: list[list[float]], teacher: list[list[float]]) -> float:
    diffs = [(a - b) ** 2 for s, t in zip(student, teacher) for a, b in zip(s, t)]
    return sum(diffs) / len(diffs)


def tensors(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(STUDENT, requires_grad=requires_grad), torch.tensor(TEACHER), torch.tensor(LABELS))


# ----------------------------------------------------------------------------- soft targets

def test_hand_reference_is_what_we_think():
    # One row by hand: T = 1, s = [0, 0], t = [ln 3, 0] -> p_t = [3/4, 1/4], p_s = [1/2, 1/2].
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert hand_soft_target([[0.0, 0.0]], [[math.log(3.0), 0.0]], 1.0) == pytest.approx(expected)


@pytest.mark.parametrize("T", [1.0, 2.0, 4.0, 0.5])
def test_soft_target_matches_hand_computed_kl_times_t_squared(T):
    s, t, _ = tensors()
    assert soft_target_kd(s, t, T).item() == pytest.approx(hand_soft_target(STUDENT, TEACHER, T), rel=1e-5)


@pytest.mark.parametrize("T", [1.0, 3.0, 8.0])
def test_soft_target_is_t_squared_times_the_plain_kl(T):
    s, t, _ = tensors()
    plain_kl = hand_soft_target(STUDENT, TEACHER, T) / (T * T)
    assert soft_target_kd(s, t, T).item() / (T * T) == pytest.approx(plain_kl, rel=1e-5)


@pytest.mark.parametrize("T", [1.0, 4.0])
def test_soft_target_gradient_is_t_times_probability_gap(T):
    # d/ds [T^2 KL(p_t || softmax(s/T))] / B = T (softmax(s/T) - p_t) / B: the T^2 factor keeps
    # the gradient O(1/T) instead of O(1/T^2), the reason Hinton et al. multiply by it.
    s, t, _ = tensors(requires_grad=True)
    soft_target_kd(s, t, T).backward()
    batch = len(STUDENT)
    expected = [[T * (ps - pt) / batch for ps, pt in zip(softmax(srow, T), softmax(trow, T))]
                for srow, trow in zip(STUDENT, TEACHER)]
    assert torch.allclose(s.grad, torch.tensor(expected), atol=1e-6)


def test_soft_target_is_zero_when_student_matches_teacher():
    _, t, _ = tensors()
    assert soft_target_kd(t.clone(), t, 4.0).item() == pytest.approx(0.0, abs=1e-7)


def test_soft_target_computes_in_float32_from_bf16_logits():
    s, t, _ = tensors()
    loss = soft_target_kd(s.bfloat16(), t.bfloat16(), 2.0)
    rounded_s = s.bfloat16().float().tolist()
    rounded_t = t.bfloat16().float().tolist()
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(hand_soft_target(rounded_s, rounded_t, 2.0), rel=1e-5)


# ----------------------------------------------------------------------------- mixing and modes

@pytest.mark.parametrize("lambda_kd", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("T", [1.0, 4.0])
def test_st_loss_mixes_kd_and_cross_entropy(lambda_kd, T):
    s, t, y = tensors()
    expected = (lambda_kd * hand_soft_target(STUDENT, TEACHER, T)
                + (1 - lambda_kd) * hand_cross_entropy(STUDENT, LABELS))
    loss = kd_loss(s, t, y, KDLossParams("st", T, lambda_kd))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("lambda_kd", [0.0, 0.5, 1.0])
def test_logits_mode_is_mse_mixed_with_cross_entropy(lambda_kd):
    s, t, y = tensors()
    expected = lambda_kd * hand_mse(STUDENT, TEACHER) + (1 - lambda_kd) * hand_cross_entropy(STUDENT, LABELS)
    assert logits_kd(s, t).item() == pytest.approx(hand_mse(STUDENT, TEACHER), rel=1e-6)
    assert kd_loss(s, t, y, KDLossParams("logits", 4.0, lambda_kd)).item() == pytest.approx(expected, rel=1e-5)


def test_logits_mode_ignores_the_temperature():
    s, t, y = tensors()
    losses = {kd_loss(s, t, y, KDLossParams("logits", T, 0.7)).item() for T in (0.5, 1.0, 8.0)}
    assert len(losses) == 1


def test_teacher_logits_receive_no_gradient():
    s, t, y = tensors(requires_grad=True)
    t.requires_grad_(True)
    for mode in KD_MODES:
        kd_loss(s, t, y, KDLossParams(mode, 2.0, 0.5)).backward()
        assert t.grad is None
        assert s.grad is not None and s.grad.abs().sum() > 0


def test_training_loss_without_teacher_is_cross_entropy():
    s, _, y = tensors()
    loss = training_loss(s, None, y, KDLossParams("st", 4.0, 1.0))  # lambda 1 would drop CE if KD were used
    assert loss.item() == pytest.approx(hand_cross_entropy(STUDENT, LABELS), rel=1e-6)


def test_training_loss_with_teacher_is_the_kd_loss():
    s, t, y = tensors()
    params = KDLossParams("st", 2.0, 0.6)
    assert torch.equal(training_loss(s, t, y, params), kd_loss(s, t, y, params))


# ----------------------------------------------------------------------------- bad parameters

@pytest.mark.parametrize("mode", ["kl", "", "ST"])
def test_unknown_mode_is_refused(mode):
    with pytest.raises(ValueError, match=r"kd\.mode.*st.*logits"):
        KDLossParams(mode=mode)


@pytest.mark.parametrize("T", [0.0, -1.0, float("nan")])
def test_non_positive_temperature_is_refused(T):
    with pytest.raises(ValueError, match=r"kd\.T must be > 0"):
        KDLossParams(T=T)


@pytest.mark.parametrize("lambda_kd", [-0.1, 1.5, float("nan")])
def test_lambda_outside_unit_interval_is_refused(lambda_kd):
    with pytest.raises(ValueError, match=r"kd\.lambda_kd.*\[0, 1\]"):
        KDLossParams(lambda_kd=lambda_kd)
