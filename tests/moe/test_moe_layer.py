"""``MoELayer`` (SPEC section 8) at R = 1: router top-k -> dispatch -> GroupedExperts -> combine,
forward and backward, each recipe against fp32 math on the same routing, several layers, activation
checkpointing, no host sync and CUDA-graph capture on the GPU. The multi-GPU run is
tests/support/ep_multigpu.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint

import torch_bindings as tb
from tests.conftest import no_sync
from tests.support.ep_cases import fake_data_parallel_world
from tests.support.grouped_mm_cases import sqnr_db
from torch_bindings.warn import forget

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
T, D, H, E, K = 96, 128, 64, 8, 2
FLOOR = {"fp8_rowwise": 20.0, "mxfp8": 20.0, "bf16": 30.0}


@pytest.fixture(autouse=True)
def _quiet_emulation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _layer(device, recipe, seed=0, **options):
    torch.manual_seed(seed)
    return tb.MoELayer(D, H, E, K, recipe=recipe, device=device, **options)


def _fp32_layer(layer, x, grad):
    """The layer in fp32 on the CPU with the layer's own expert choice (top-k of the bf16 router);
    the routing weights from an fp32 router, so x's gradient includes the router's path."""
    idx, _ = layer.route(x)
    w13 = layer.experts.w13.detach().float().cpu().requires_grad_()
    w2 = layer.experts.w2.detach().float().cpu().requires_grad_()
    xs = x.detach().float().cpu().requires_grad_()
    probs = torch.softmax(xs @ layer.router.weight.detach().float().cpu().T, dim=-1)
    weights = probs.gather(1, idx.cpu())
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(xs)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(idx[t, j])
            h13 = xs[t] @ w13[e].T
            h = torch.nn.functional.silu(h13[:H]) * h13[H:]
            out[t] = out[t] + weights[t, j] * (h @ w2[e].T)
    out.backward(grad.float().cpu())
    return out.detach(), xs.grad, w13.grad, w2.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8", "bf16"])
def test_layer_matches_fp32_math(device, recipe):
    layer = _layer(device, recipe)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, D, generator=gen).bfloat16().to(device).requires_grad_()
    grad = torch.randn(T, D, generator=gen).bfloat16().to(device)
    out = layer(x)
    out.backward(grad)
    want = _fp32_layer(layer, x, grad)
    got = (out, x.grad, layer.experts.w13.grad, layer.experts.w2.grad)
    for a, b in zip(got, want, strict=True):
        assert sqnr_db(a.cpu(), b) >= FLOOR[recipe]
    assert layer.router.weight.grad is not None  # through combine's weights gradient


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_dispatch_into_fp8_experts(device):
    """dispatch_recipe='bf16' (the receiver quantizes) against the quantized dispatch: close."""
    a = _layer(device, "fp8_rowwise")
    b = _layer(device, "fp8_rowwise", dispatch_recipe="bf16")
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(2)).bfloat16().to(device)
    assert sqnr_db(a(x), b(x)) >= 25.0


@pytest.mark.parametrize("device", DEVICES)
def test_layers_and_checkpointing(device):
    """Three layers, the middle one under torch.utils.checkpoint: the same gradients as without."""
    layers = torch.nn.ModuleList(
        _layer(device, r, seed=i) for i, r in enumerate(["bf16", "fp8_rowwise", "bf16"])
    )
    x0 = torch.randn(T, D, generator=torch.Generator().manual_seed(3)).bfloat16().to(device)

    def run(checkpointed: bool):
        layers.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        h = x
        for i, layer in enumerate(layers):
            h = checkpoint.checkpoint(layer, h, use_reentrant=False) if checkpointed and i == 1 else layer(h)
        h.float().square().sum().backward()
        return [x.grad.clone()] + [p.grad.clone() for p in layers.parameters()]

    for a, b in zip(run(True), run(False), strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_options_are_checked():
    with pytest.raises(ValueError, match="MoELayer: dispatch_recipe 'mxfp8' sends tokens"):
        tb.MoELayer(D, H, E, K, recipe="fp8_rowwise", dispatch_recipe="mxfp8")


@pytest.mark.parametrize("dispatch_recipe", ["mxfp8", "bf16"])
def test_alignment_must_suit_the_recipe(dispatch_recipe):
    """mxfp8 experts take groups aligned to 32 rows: alignment 16 is refused at construction (a bf16
    dispatch would hand them 16-row groups as aligned: wrong results, no error)."""
    from torch_bindings.moe import routed_experts

    message = r"MoELayer: alignment 16 does not suit the 'mxfp8' experts.*multiples of 32"
    with pytest.raises(ValueError, match=message):
        tb.MoELayer(D, H, E, K, recipe="mxfp8", dispatch_recipe=dispatch_recipe, alignment=16)
    with pytest.raises(ValueError, match="MoELayer: alignment must be one of"):
        tb.MoELayer(D, H, E, K, recipe="bf16", alignment=24)
    for recipe, alignment in (("fp8_rowwise", 16), ("mxfp8", 64), ("bf16", 16)):
        assert tb.MoELayer(D, H, E, K, recipe=recipe, alignment=alignment).alignment == alignment
    experts = tb.GroupedExperts(E, D, H, recipe="mxfp8")
    x = torch.randn(T, D).bfloat16()
    idx, w = torch.randint(0, E, (T, K)), torch.rand(T, K)
    with pytest.raises(ValueError, match="routed_experts: alignment 16 does not suit"):
        routed_experts(x, idx, w, experts, num_experts=E, dispatch_recipe=dispatch_recipe, alignment=16)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "bf16"])
def test_gpu_no_sync_and_cuda_graph(recipe):
    layer = _layer("cuda", recipe)
    x = torch.randn(T, D, device="cuda").bfloat16().requires_grad_()

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        out.float().square().sum().backward()
        return out

    step()
    with no_sync():
        eager = step().detach().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.uint8), eager.view(torch.uint8))


def test_layer_without_a_group_stays_local_under_data_parallelism(monkeypatch):
    """A DDP/FSDP run (multi-rank default group) with MoELayer(): every expert on every rank, no
    communication: the same output as outside torch.distributed."""
    from torch_bindings import ep

    x = torch.randn(T, D, generator=torch.Generator().manual_seed(4)).bfloat16()
    want = _layer("cpu", "bf16")(x)
    touched = fake_data_parallel_world(monkeypatch)
    assert ep.group_size(ep.LOCAL) == 1
    from torch_bindings.moe import layer as layer_module

    forget(layer_module.LOCAL_WARNING)
    with pytest.warns(UserWarning, match="group=None runs every expert on this rank") as record:
        layer = _layer("cpu", "bf16")
    (warned,) = [r for r in record if "group=None runs every expert" in str(r.message)]
    assert warned.filename == __file__  # the caller's line, not the library's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _layer("cpu", "bf16")  # once per process
    assert layer.experts.w13.shape[0] == E and layer.group is ep.LOCAL
    got = layer(x)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not touched and list(ep._POOLS) == [(None, torch.device("cpu"))]


def test_routed_experts_checks_the_experts_count():
    from torch_bindings.moe import routed_experts

    layer = _layer("cpu", "bf16")
    x = torch.randn(T, D).bfloat16()
    idx, w = layer.route(x)
    with pytest.raises(ValueError, match=r"experts holds 8 experts.*16 / 1"):
        routed_experts(x, idx, w, layer.experts, num_experts=2 * E, dispatch_recipe="bf16")


def test_local_sentinel_is_one_object():
    import copy
    import pickle

    from torch_bindings import ep

    assert pickle.loads(pickle.dumps(ep.LOCAL)) is ep.LOCAL and copy.deepcopy(ep.LOCAL) is ep.LOCAL
