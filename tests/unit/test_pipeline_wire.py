"""Channels_last activations between stages (synapse.pipeline.wire): no copies, same numbers.

On the CPU the trainer runs NCHW and the wire is off; these tests turn channels_last on for a
ResNet stage on the CPU, where the same layout choices (and so the same kernels) apply.
"""
from __future__ import annotations

import copy

import torch

from synapse.models import build_model, model_blocks
from synapse.pipeline import FusedStage, from_wire, to_wire


def test_a_channels_last_activation_travels_as_its_nhwc_view_without_a_copy():
    x = torch.randn(2, 8, 5, 3).contiguous(memory_format=torch.channels_last)
    sent = to_wire(x, channels_last=True)
    assert sent.shape == (2, 5, 3, 8) and sent.is_contiguous()
    assert sent.data_ptr() == x.data_ptr()  # the same memory
    received = from_wire(sent.clone(), channels_last=True)
    assert received.shape == x.shape and received.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(received, x)


def test_other_tensors_and_a_wire_that_is_off_travel_as_before():
    nchw = torch.randn(2, 8, 5, 3)
    tokens = torch.randn(2, 17, 8).transpose(1, 2)  # a strided view, as a ViT block may hand on
    assert to_wire(nchw, channels_last=False).shape == nchw.shape
    assert from_wire(nchw, channels_last=False) is nchw
    sent_tokens = to_wire(tokens, channels_last=True)
    assert sent_tokens.is_contiguous() and torch.equal(sent_tokens, tokens)
    assert from_wire(sent_tokens, channels_last=True) is sent_tokens
    # an NCHW activation on a channels_last wire: converted once by the sender, exact
    assert torch.equal(from_wire(to_wire(nchw, True).clone(), True), nchw)


def test_a_received_leaf_is_copied_before_an_in_place_first_block_touches_a_view_of_it():
    leaf = torch.randn(2, 3, 4, 8, requires_grad=True)  # NHWC-shaped, as received
    x = from_wire(leaf, channels_last=True)
    torch.relu_(x)  # would raise on a view of a leaf that requires grad
    x.sum().backward()
    assert leaf.grad.shape == leaf.shape


def _resnet_stage(channels_last_wire: bool) -> tuple[FusedStage, torch.Tensor]:
    torch.manual_seed(0)
    teacher = build_model("vit_micro", 10, 3, 32)
    student = build_model("resnet_micro", 10, 3, 32).to(memory_format=torch.channels_last)
    t_blocks, s_blocks = model_blocks(teacher), model_blocks(student)
    images = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        s_in = images
        for block in s_blocks[:4]:
            s_in = block(s_in)
    assert s_in.is_contiguous(memory_format=torch.channels_last)
    stage = FusedStage(t_blocks[2:3], s_blocks[4:6], is_first=False, channels_last_wire=channels_last_wire)
    return stage, s_in


def test_a_stage_on_the_wire_computes_and_learns_exactly_what_it_does_on_channels_last_inputs():
    wired, activation = _resnet_stage(channels_last_wire=True)
    plain = copy.deepcopy(wired)
    plain.channels_last_wire = False
    teacher_in = torch.randn(4, 17, 32)

    received = to_wire(activation, True).detach().clone().requires_grad_(True)  # NHWC, as a recv buffer
    reference_in = activation.detach().clone().requires_grad_(True)  # channels_last, what the stage runs on
    _, sent = wired(teacher_in, received)
    _, reference = plain(teacher_in, reference_in)
    assert sent.shape == (4,) + reference.shape[2:] + reference.shape[1:2]  # NHWC on the wire
    assert sent.is_contiguous()  # dense, as a send needs
    assert torch.equal(from_wire(sent.detach(), True), reference)

    gradient = torch.randn(reference.shape).contiguous(memory_format=torch.channels_last)
    sent.backward(to_wire(gradient, True))
    reference.backward(gradient)
    assert torch.equal(from_wire(received.grad, True), reference_in.grad)
    for a, b in zip(wired.student.parameters(), plain.student.parameters()):
        assert torch.equal(a.grad, b.grad)
