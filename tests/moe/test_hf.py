"""transformers integration (``torch_bindings.moe.hf``): a tiny Qwen3-MoE model trains a few steps on the
registered experts implementations, against the model's own experts. Skipped without transformers
(an optional dependency)."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch_bindings.moe import hf  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _config():
    return transformers.Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=64,
    )


def _train(implementation: str, device, steps: int = 3, dtype=torch.bfloat16):
    """Losses of ``steps`` SGD steps and the experts' gradients of the first step."""
    hf.register()
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(_config()).to(device=device, dtype=dtype)
    model.set_experts_implementation(implementation)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1)).to(device)
    losses, grads = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # emulated GEMMs (CPU)
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if grads is None:
                grads = [p.grad.float().clone() for n, p in model.named_parameters() if "experts" in n]
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses, grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_experts_train_like_the_models_own(device):
    own_losses, own_grads = _train("grouped_mm", device)
    losses, grads = _train("cute_bf16", device)
    assert losses == pytest.approx(own_losses, rel=1e-3)
    for got, want in zip(grads, own_grads, strict=True):
        assert _relative(got, want) < 2e-2  # bf16 routing-weight products rounded in another order


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("implementation", ["cute_fp8_rowwise", "cute_mxfp8"])
def test_fp8_experts_train_close_to_the_models_own(device, implementation):
    own_losses, own_grads = _train("grouped_mm", device)
    losses, grads = _train(implementation, device)
    assert losses == pytest.approx(own_losses, rel=1e-2)
    for got, want in zip(grads, own_grads, strict=True):
        assert _relative(got, want) < 0.15  # MXFP8 on Hopper: 0.11 seen on an H100


@pytest.mark.gpu
def test_own_gemm_experts_train_close_to_the_models_own():
    """``cute_fp8_rowwise_sm90`` (the project's FP8 grouped GEMM, 128-row dispatch groups) on an
    sm_90 GPU; elsewhere its first call raises, naming the missing piece."""
    from torch_bindings.moe.grouped_mm import cute_gemm_reason

    why = cute_gemm_reason(torch.device("cuda"))
    if why is not None:
        with pytest.raises(RuntimeError, match="gemm='cute' cannot run here"):
            _train("cute_fp8_rowwise_sm90", "cuda", steps=1)
        return
    own_losses, own_grads = _train("grouped_mm", "cuda")
    losses, grads = _train("cute_fp8_rowwise_sm90", "cuda")
    assert losses == pytest.approx(own_losses, rel=1e-2)
    for got, want in zip(grads, own_grads, strict=True):
        assert _relative(got, want) < 0.15


def test_own_gemm_implementation_is_registered_and_refused_on_cpu():
    assert "cute_fp8_rowwise_sm90" in hf.register()
    with pytest.raises(RuntimeError, match="gemm='cute' cannot run here"):
        _train("cute_fp8_rowwise_sm90", "cpu", steps=1)


def test_fp32_model_trains():
    own, _ = _train("grouped_mm", "cpu", dtype=torch.float32)
    ours, _ = _train("cute_fp8_rowwise", "cpu", dtype=torch.float32)
    assert ours == pytest.approx(own, rel=1e-2)


def test_unsupported_experts_are_refused():
    experts = torch.nn.Module()
    experts.gate_up_proj = torch.nn.Parameter(torch.zeros(2, 64, 32))
    experts.down_proj = torch.nn.Parameter(torch.zeros(2, 32, 32))
    experts.has_bias, experts.act_fn = True, torch.nn.GELU()
    with pytest.raises(ValueError, match="expert biases, activation GELU"):
        hf.hf_weights(experts)


def test_experts_stay_local_under_data_parallelism(monkeypatch):
    """A data-parallel run (a multi-rank default group) keeps every expert local: the same losses as
    outside torch.distributed, and no multi-rank buffers asked for."""
    from tests.support.ep_cases import fake_data_parallel_world

    want, _ = _train("cute_bf16", "cpu", steps=1)
    touched = fake_data_parallel_world(monkeypatch)
    got, _ = _train("cute_bf16", "cpu", steps=1)
    assert got == want and not touched
